//! A cluster of real `metaserver` processes on loopback: temp data dirs, one proxy in front of each
//! node for the Raft traffic (so links can be cut), start/kill/restart, waiting on `/v1/cluster`, and
//! the final comparison of every node with the model. Dropping it kills every process.

use crate::note::note;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::binary::metaserver_binary;
use crate::client::{http_client, Api, Consistency};
use crate::model::Model;
use crate::poll::poll_until;
use crate::process::{tail, LaunchSpec, ServerProcess};
use crate::proxy::{LinkProxy, PidTable};
use crate::registry_state::RegistryState;
use crate::status::ClusterStatus;

/// Keep the data and log directory of a failed test when this variable is set.
pub const KEEP_ENV: &str = "META_TEST_KEEP";

/// How long a node may take to print `listening on`.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The client addresses of the live nodes, shared with workloads (a restarted node gets a new port).
#[derive(Clone, Default)]
pub struct Endpoints(Arc<RwLock<BTreeMap<u64, Option<SocketAddr>>>>);

impl Endpoints {
    /// The live nodes and their client addresses.
    pub fn live(&self) -> Vec<(u64, SocketAddr)> {
        self.0
            .read()
            .unwrap()
            .iter()
            .filter_map(|(id, addr)| addr.map(|a| (*id, a)))
            .collect()
    }

    /// The client address of node `id` if it runs.
    pub fn get(&self, id: u64) -> Option<SocketAddr> {
        self.0.read().unwrap().get(&id).copied().flatten()
    }

    fn set(&self, id: u64, addr: Option<SocketAddr>) {
        self.0.write().unwrap().insert(id, addr);
    }
}

struct NodeSlot {
    data_dir: PathBuf,
    process: Option<ServerProcess>,
    starts: u32,
    wiped: bool,
    logs: Option<(PathBuf, PathBuf)>,
}

/// How to start the cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Number of nodes (ids 1..=nodes); node 1 initializes the cluster.
    pub nodes: u64,
    /// Environment for every node (e.g. `METASERVER_SNAPSHOT_MAX_BYTES_PER_SEC`).
    pub env: Vec<(String, String)>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 3,
            env: Vec::new(),
        }
    }
}

/// A running cluster.
pub struct Cluster {
    name: String,
    dir: Option<tempfile::TempDir>,
    binary: PathBuf,
    config: ClusterConfig,
    http: reqwest::Client,
    pids: PidTable,
    proxies: BTreeMap<u64, LinkProxy>,
    nodes: BTreeMap<u64, NodeSlot>,
    endpoints: Endpoints,
}

impl Cluster {
    /// Starts every node (node 1 with `--init`) and waits until they agree on a leader.
    pub async fn start(name: &str, config: ClusterConfig) -> anyhow::Result<Cluster> {
        let binary = tokio::task::spawn_blocking(metaserver_binary).await??;
        let dir = tempfile::Builder::new()
            .prefix(&format!("meta-tests-{name}-"))
            .tempdir()?;
        std::fs::create_dir_all(dir.path().join("logs"))?;
        let pids = PidTable::default();
        let mut proxies = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        let endpoints = Endpoints::default();
        for id in 1..=config.nodes {
            proxies.insert(id, LinkProxy::bind(pids.clone()).await?);
            let data_dir = dir.path().join(format!("node-{id}"));
            nodes.insert(
                id,
                NodeSlot {
                    data_dir,
                    process: None,
                    starts: 0,
                    wiped: false,
                    logs: None,
                },
            );
            endpoints.set(id, None);
        }
        let mut cluster = Cluster {
            name: name.to_owned(),
            dir: Some(dir),
            binary,
            config,
            http: http_client(),
            pids,
            proxies,
            nodes,
            endpoints,
        };
        note(format!("[{name}] cluster dir {}", cluster.root().display()));
        for id in cluster.ids() {
            cluster.start_node(id, &[]).await?;
        }
        let ids = cluster.ids();
        cluster.wait_leader(&ids, Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    /// All node ids.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The ids of the nodes whose process runs.
    pub fn live_ids(&self) -> Vec<u64> {
        self.endpoints
            .live()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// The shared client addresses, for workloads.
    pub fn endpoints(&self) -> Endpoints {
        self.endpoints.clone()
    }

    /// The shared HTTP client.
    pub fn http(&self) -> reqwest::Client {
        self.http.clone()
    }

    /// The directory holding data dirs and logs.
    pub fn root(&self) -> &Path {
        self.dir.as_ref().expect("cluster dir").path()
    }

    /// Node `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.nodes[&id].data_dir.clone()
    }

    /// The address through which the other nodes reach node `id` (its proxy): its address in the
    /// cluster membership.
    pub fn raft_addr(&self, id: u64) -> SocketAddr {
        self.proxies[&id].addr()
    }

    fn peers_arg(&self) -> String {
        self.proxies
            .iter()
            .map(|(id, proxy)| format!("{id}={}", proxy.addr()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn launch_spec(&mut self, id: u64, extra_env: &[(String, String)]) -> LaunchSpec {
        let peers = self.peers_arg();
        let root = self.root().to_owned();
        let slot = self.nodes.get_mut(&id).expect("known node");
        slot.starts += 1;
        let mut args = vec![
            String::from("serve"),
            String::from("--id"),
            id.to_string(),
            String::from("--listen"),
            String::from("127.0.0.1:0"),
            String::from("--data-dir"),
            slot.data_dir.display().to_string(),
            String::from("--advertise"),
            self.proxies[&id].addr().to_string(),
            String::from("--peers"),
            peers,
        ];
        // The same command line on every start of node 1, as an operator would use it: the cluster
        // must initialize on the first start only. A wiped node rejoins as a learner instead.
        if id == 1 && !slot.wiped {
            args.push(String::from("--init"));
        }
        let mut env = vec![(String::from("NO_COLOR"), String::from("1"))];
        env.extend(self.config.env.iter().cloned());
        env.extend(extra_env.iter().cloned());
        let stdout_log = root
            .join("logs")
            .join(format!("node-{id}.{}.out", slot.starts));
        let stderr_log = root
            .join("logs")
            .join(format!("node-{id}.{}.err", slot.starts));
        slot.logs = Some((stdout_log.clone(), stderr_log.clone()));
        LaunchSpec {
            binary: self.binary.clone(),
            args,
            env,
            stdout_log,
            stderr_log,
        }
    }

    /// Starts node `id` (it must be down) with extra environment, waits for `listening on`, and
    /// points its proxy at it.
    pub async fn start_node(
        &mut self,
        id: u64,
        extra_env: &[(String, String)],
    ) -> anyhow::Result<SocketAddr> {
        anyhow::ensure!(self.nodes[&id].process.is_none(), "node {id} already runs");
        let spec = self.launch_spec(id, extra_env);
        let mut process = ServerProcess::spawn(&spec)?;
        let pid = process.pid();
        self.pids.insert(pid, id);
        let addr = match process.listening(START_TIMEOUT).await {
            Ok(addr) => addr,
            Err(err) => {
                self.pids.remove(pid);
                return Err(err.context(format!("start node {id}")));
            }
        };
        self.proxies[&id].set_target(Some(addr));
        self.endpoints.set(id, Some(addr));
        self.nodes.get_mut(&id).expect("known node").process = Some(process);
        note(format!(
            "[{}] node {id} (pid {pid}) listening on {addr}",
            self.name
        ));
        Ok(addr)
    }

    /// Starts node `id` expecting it to refuse: waits for it to exit and returns its status and
    /// output. Fails if it is still running after `timeout`.
    pub async fn start_node_expecting_exit(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> anyhow::Result<(ExitStatus, String)> {
        anyhow::ensure!(self.nodes[&id].process.is_none(), "node {id} already runs");
        let spec = self.launch_spec(id, &[]);
        let mut process = ServerProcess::spawn(&spec)?;
        let status = process.wait_exit(timeout).await;
        let output = process.output();
        drop(process);
        match status {
            Ok(status) => Ok((status, output)),
            Err(err) => Err(err.context(format!(
                "node {id} kept running; output:\n{}",
                tail(&output, 40)
            ))),
        }
    }

    fn forget_process(&mut self, id: u64) -> Option<ServerProcess> {
        self.endpoints.set(id, None);
        self.proxies[&id].set_target(None);
        let process = self
            .nodes
            .get_mut(&id)
            .expect("known node")
            .process
            .take()?;
        self.pids.remove(process.pid());
        Some(process)
    }

    /// Sends `signal` to node `id`'s process.
    fn signal(&self, id: u64, signal: libc::c_int) -> anyhow::Result<()> {
        let pid = self.nodes[&id]
            .process
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("node {id} is not running"))?
            .pid();
        // SAFETY: kill(2) with a pid this cluster started and still owns.
        anyhow::ensure!(
            unsafe { libc::kill(pid as libc::pid_t, signal) } == 0,
            "signal {signal} to node {id}: {}",
            std::io::Error::last_os_error()
        );
        Ok(())
    }

    /// Stops node `id`'s process (SIGSTOP) until [`Cluster::resume`]: it keeps its sockets, so
    /// the kernel still accepts connections to it and queues what they send.
    pub fn pause(&self, id: u64) -> anyhow::Result<()> {
        self.signal(id, libc::SIGSTOP)?;
        note(format!("[{}] node {id} paused", self.name));
        Ok(())
    }

    /// Lets node `id`'s process run again (SIGCONT).
    pub fn resume(&self, id: u64) -> anyhow::Result<()> {
        self.signal(id, libc::SIGCONT)?;
        note(format!("[{}] node {id} resumed", self.name));
        Ok(())
    }

    /// SIGKILL node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut process) = self.forget_process(id) {
            process.kill();
            note(format!("[{}] node {id} killed", self.name));
        }
    }

    /// SIGTERM node `id` and wait for it to exit (SIGKILL after 20 s).
    pub async fn stop(&mut self, id: u64) -> anyhow::Result<ExitStatus> {
        let mut process = self
            .forget_process(id)
            .ok_or_else(|| anyhow::anyhow!("node {id} is not running"))?;
        let status = process.terminate(Duration::from_secs(20)).await?;
        note(format!("[{}] node {id} stopped: {status}", self.name));
        Ok(status)
    }

    /// Deletes node `id`'s data dir (it must be down). Its later starts never pass `--init`.
    pub fn wipe(&mut self, id: u64) -> anyhow::Result<()> {
        let slot = self.nodes.get_mut(&id).expect("known node");
        anyhow::ensure!(slot.process.is_none(), "node {id} runs");
        if slot.data_dir.exists() {
            std::fs::remove_dir_all(&slot.data_dir)?;
        }
        slot.wiped = true;
        Ok(())
    }

    /// A client for node `id` (which must run).
    pub fn api(&self, id: u64) -> anyhow::Result<Api> {
        let addr = self
            .endpoints
            .get(id)
            .ok_or_else(|| anyhow::anyhow!("node {id} is not running"))?;
        Ok(Api::with_client(self.http.clone(), addr))
    }

    /// Node `id`'s `/v1/cluster`.
    pub async fn status(&self, id: u64) -> anyhow::Result<ClusterStatus> {
        Ok(self.api(id)?.cluster().await?)
    }

    /// Waits until the nodes `among` (all running) agree on one leader among them, and returns the
    /// leader's status.
    pub async fn wait_leader(
        &self,
        among: &[u64],
        timeout: Duration,
    ) -> anyhow::Result<ClusterStatus> {
        let what = format!("nodes {among:?} to agree on a leader among them");
        poll_until(&what, timeout, || async {
            let mut statuses = Vec::new();
            for id in among {
                statuses.push(self.status(*id).await?);
            }
            let Some(leader) = statuses.iter().find(|s| s.is_leader()) else {
                anyhow::bail!("no leader: {}", brief(&statuses));
            };
            let agreed = statuses
                .iter()
                .all(|s| s.leader == Some(leader.id) && s.term == leader.term);
            if agreed {
                Ok(Some(leader.clone()))
            } else {
                anyhow::bail!("no agreement: {}", brief(&statuses))
            }
        })
        .await
    }

    /// Waits until every node in `ids` has applied everything the leader (among `ids`) had committed
    /// when this was called, while all of them agree on that leader; returns that index.
    pub async fn wait_caught_up(&self, ids: &[u64], timeout: Duration) -> anyhow::Result<u64> {
        let leader = self.wait_leader(ids, timeout).await?;
        // A fresh read of the commit index, after every acknowledged write.
        let target = self.status(leader.id).await?.committed;
        let what = format!("nodes {ids:?} to agree on a leader and apply index {target}");
        poll_until(&what, timeout, || async {
            let mut statuses = Vec::new();
            for id in ids {
                statuses.push(self.status(*id).await?);
            }
            let leaders: Vec<&ClusterStatus> = statuses.iter().filter(|s| s.is_leader()).collect();
            let agreed = leaders.len() == 1
                && statuses
                    .iter()
                    .all(|s| s.leader == Some(leaders[0].id) && s.term == leaders[0].term);
            if agreed && statuses.iter().all(|s| s.applied >= target) {
                Ok(Some(target))
            } else {
                anyhow::bail!("{}", brief(&statuses))
            }
        })
        .await
    }

    /// Waits until node `id` has purged its log up to `index` (as `/v1/cluster` reports it);
    /// returns the purged index.
    pub async fn wait_purged(&self, id: u64, index: u64, timeout: Duration) -> anyhow::Result<u64> {
        let what = format!("node {id} to purge its log up to {index}");
        poll_until(&what, timeout, || async {
            let purged = self.status(id).await?.purged;
            match purged {
                Some(p) if p >= index => Ok(Some(p)),
                other => anyhow::bail!("purged index {other:?}"),
            }
        })
        .await
    }

    /// Cuts node `id` off from every other node (both directions of every link).
    pub fn isolate(&self, id: u64) {
        for (other, proxy) in &self.proxies {
            if *other != id {
                proxy.block(id);
                self.proxies[&id].block(*other);
            }
        }
        note(format!("[{}] node {id} isolated", self.name));
    }

    /// Limits the bytes per second that other nodes can send to node `id` (per connection); `None`
    /// lifts the limit. A slow link makes a snapshot transfer to `id` take a while.
    pub fn set_link_rate(&self, id: u64, bytes_per_sec: Option<u64>) {
        self.proxies[&id].set_rate(bytes_per_sec);
    }

    /// Restores every link.
    pub fn heal(&self) {
        for proxy in self.proxies.values() {
            proxy.unblock_all();
        }
        note(format!("[{}] links healed", self.name));
    }

    /// Waits until `ids` have caught up, then checks each node's local registry against the model
    /// and all of them against each other.
    pub async fn assert_converged(
        &self,
        ids: &[u64],
        model: &Model,
        kv_prefix: &str,
    ) -> anyhow::Result<()> {
        let index = self.wait_caught_up(ids, Duration::from_secs(60)).await?;
        let mut first: Option<(u64, RegistryState)> = None;
        for id in ids {
            let state =
                RegistryState::fetch(&self.api(*id)?, Consistency::Local, kv_prefix).await?;
            model.assert_matches(*id, &state, kv_prefix);
            match &first {
                None => first = Some((*id, state)),
                Some((first_id, first_state)) => {
                    anyhow::ensure!(
                        *first_state == state,
                        "node {first_id} and node {id} differ: {}",
                        first_state.diff(&state)
                    );
                }
            }
        }
        let (batches, replicas) = model.acked();
        note(format!(
            "[{}] nodes {ids:?} equal the model at index {index}: {batches} batches, {replicas} replicas, \
             {} keys acknowledged, {} batches unanswered",
            self.name,
            model.acked_kv(),
            model.unresolved_batches()
        ));
        Ok(())
    }
}

fn brief(statuses: &[ClusterStatus]) -> String {
    statuses
        .iter()
        .map(|s| {
            format!(
                "{}:{} term {} leader {:?} applied {}",
                s.id, s.role, s.term, s.leader, s.applied
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        for id in self.ids() {
            if let Some(mut process) = self.forget_process(id) {
                process.kill();
            }
            if panicking {
                if let Some((out, err)) = &self.nodes[&id].logs {
                    let mut text = std::fs::read_to_string(out).unwrap_or_default();
                    text.push_str(&std::fs::read_to_string(err).unwrap_or_default());
                    note(format!(
                        "[{}] ---- node {id}, last output ----\n{}",
                        self.name,
                        tail(&text, 30)
                    ));
                }
            }
        }
        if panicking && std::env::var_os(KEEP_ENV).is_some() {
            if let Some(dir) = self.dir.take() {
                note(format!("[{}] kept {}", self.name, dir.keep().display()));
            }
        }
    }
}
