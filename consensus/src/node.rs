//! A metaserver node: opens the log, the registry and Raft from a data dir, and offers the
//! API the HTTP layer and the binary use: writes (answering "forward to leader" on a
//! follower), reads with a consistency choice, membership, snapshots and status.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meta_store::{RateLimiter, WalOptions};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{ClientWriteError, ForwardToLeader, InitializeError, RaftError};
use openraft::network::NetSnapshot;
use openraft::raft::SnapshotResponse;
use openraft::{ChangeMembers, LinearizerOption, RaftNetworkFactory, ReadPolicy};

use crate::command::{Command, ShardReport};
use crate::config::NodeConfig;
use crate::data_dir::DataDirLock;
use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::snapshot_data::SnapshotData;
use crate::state_machine::{SmShared, StateMachine};
use crate::status::{ClusterStatus, ReplicationLag, Role};
use crate::types::{Node, NodeId, Raft, TypeConfig, Vote};
use crate::view::{
    Consistency, DatanodeInfo, KvEntry, KvKey, Page, ShardEntry, ShardInfo, SnapshotInfo, Written,
};

/// Marker file written once the cluster was initialized from this node.
const INITIALIZED: &str = "initialized";
/// Sub-directory where snapshots streamed from a leader land before they are installed.
const INCOMING: &str = "snapshots-incoming";
/// How often [`MetaNode::stopped`] looks whether the Raft core ended.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Largest key (bytes) and value of the key-value space.
pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most shards one register/deregister command may carry.
pub const MAX_SHARDS_PER_COMMAND: usize = 100_000;

struct Inner {
    cfg: NodeConfig,
    raft: Raft,
    sm: Arc<SmShared>,
    log: LogStore,
    incoming: PathBuf,
    shut: AtomicBool,
    /// Permits = shards that writes in flight may still claim (`max_pending_shards`).
    write_window: tokio::sync::Semaphore,
    /// The data dir's lock; released once `shutdown` has closed the log and flushed the registry.
    dir_lock: parking_lot::Mutex<Option<DataDirLock>>,
}

/// A metaserver node. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct MetaNode {
    inner: Arc<Inner>,
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Raft(format!("blocking task failed: {e}")))?
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync directory", dir, e))
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidArgument(format!(
            "key must be 1 to {MAX_KEY_BYTES} bytes, got {}",
            key.len()
        )));
    }
    Ok(())
}

fn check_shards(n: usize) -> Result<()> {
    if n > MAX_SHARDS_PER_COMMAND {
        return Err(Error::InvalidArgument(format!(
            "{n} shards in one command; at most {MAX_SHARDS_PER_COMMAND}"
        )));
    }
    Ok(())
}

/// Refuses commands the registry would never want, before they reach the log.
fn validate(cmd: &Command) -> Result<()> {
    match cmd {
        Command::RegisterDatanode { addr, .. } => {
            if addr.is_empty() || addr.len() > MAX_KEY_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "datanode address must be 1 to {MAX_KEY_BYTES} bytes"
                )));
            }
        }
        Command::RegisterShards { shards, .. } => check_shards(shards.len())?,
        Command::DeregisterShards { shards, .. } => check_shards(shards.len())?,
        Command::RemoveDatanode { .. } => {}
        Command::Put { key, value, .. } => {
            check_key(key)?;
            if value.len() > MAX_VALUE_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "value of {} bytes; at most {MAX_VALUE_BYTES}",
                    value.len()
                )));
            }
        }
        Command::Delete { key, .. } => check_key(key)?,
    }
    Ok(())
}

impl MetaNode {
    /// Opens the node in `cfg.data_dir` (creating it if needed) and starts Raft with `network`.
    /// Recovers the log, the registry and, when the registry is behind the log's purge point,
    /// reloads it from the newest snapshot. Never initializes a cluster: see
    /// [`MetaNode::initialize`].
    pub async fn open<N>(cfg: NodeConfig, network: N) -> Result<MetaNode>
    where
        N: RaftNetworkFactory<TypeConfig>,
        N::Network: NetSnapshot<TypeConfig, SnapshotData = SnapshotData>,
    {
        cfg.validate()?;
        let window = cfg.max_pending_shards;
        let raft_config = Arc::new(cfg.raft_config()?);
        let c = cfg.clone();
        let (dir_lock, log, sm, incoming) = blocking(move || {
            std::fs::create_dir_all(&c.data_dir)
                .map_err(|e| Error::io("create data dir", &c.data_dir, e))?;
            // Before anything in the dir is touched: log recovery may cut a torn tail.
            let dir_lock = DataDirLock::acquire(&c.data_dir, c.id)?;
            let incoming = c.data_dir.join(INCOMING);
            if incoming.exists() {
                std::fs::remove_dir_all(&incoming)
                    .map_err(|e| Error::io("clear incoming snapshots", &incoming, e))?;
            }
            std::fs::create_dir_all(&incoming)
                .map_err(|e| Error::io("create incoming snapshots dir", &incoming, e))?;
            let log = LogStore::open(
                &c.wal_dir(),
                WalOptions {
                    segment_bytes: c.wal_segment_bytes,
                    barrier: c.barrier,
                    extra_sync_latency: c.emulated_sync_latency,
                    ..WalOptions::default()
                },
            )?;
            let limiter = Arc::new(RateLimiter::new(c.snapshot_max_bytes_per_sec));
            let sm = StateMachine::open(
                &c.registry_dir(),
                &c.snapshot_dir(),
                c.sled_cache_bytes,
                c.snapshots_to_keep,
                limiter,
            )?;
            Ok((dir_lock, log, sm, incoming))
        })
        .await?;
        let shared = sm.shared();
        // Openraft's startup reloads the registry from the newest snapshot when it is behind,
        // re-applies committed entries, and rebuilds a snapshot if the log was purged without
        // one; see `check_not_behind_purge` for the check that it did.
        let raft = Raft::new(cfg.id, raft_config, network, log.clone(), sm)
            .await
            .map_err(|e| Error::Raft(format!("start raft: {e}")))?;
        let node = MetaNode {
            inner: Arc::new(Inner {
                cfg,
                raft,
                sm: shared,
                log,
                incoming,
                shut: AtomicBool::new(false),
                write_window: tokio::sync::Semaphore::new(window as usize),
                dir_lock: parking_lot::Mutex::new(Some(dir_lock)),
            }),
        };
        node.check_not_behind_purge()?;
        Ok(node)
    }

    /// The registry must never be behind the log's purge point after open (openraft's startup
    /// has restored it from the newest snapshot by now if it was).
    fn check_not_behind_purge(&self) -> Result<()> {
        let applied = self.inner.sm.applied().0.map(|l| l.index);
        let purged = self.inner.log.last_purged().map(|l| l.index);
        if purged > applied {
            return Err(Error::Snapshot(format!(
                "registry applied up to {applied:?} but the log is purged up to {purged:?}"
            )));
        }
        Ok(())
    }

    pub fn id(&self) -> NodeId {
        self.inner.cfg.id
    }

    pub fn addr(&self) -> &str {
        &self.inner.cfg.addr
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.cfg
    }

    /// The Raft handle: the HTTP `/raft` router calls `append_entries`, `vote`,
    /// `handle_transfer_leader` on it (and [`MetaNode::install_received_snapshot`]).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.shut.load(Ordering::Acquire) || self.core_stopped() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    /// Whether openraft's core task ended (a fatal error or a panic).
    fn core_stopped(&self) -> bool {
        self.core_failure().is_some()
    }

    /// Why openraft's core task ended, if it did: its last metrics carry the fatal error, or
    /// its metrics channel is closed.
    fn core_failure(&self) -> Option<String> {
        use futures::FutureExt as _;
        let mut rx = self.inner.raft.metrics();
        if let Err(fatal) = &rx.borrow_and_update().running_state {
            return Some(fatal.to_string());
        }
        matches!(rx.changed().now_or_never(), Some(Err(_))).then(|| "the Raft core ended".into())
    }

    /// Waits until openraft's core task ends while the node is open (a fatal storage error or
    /// a panic: the node can then serve nothing until it is restarted) and returns why.
    /// Never returns for a node that is shut down instead.
    ///
    /// It looks every [`STOP_CHECK_INTERVAL`] rather than on every change of the metrics:
    /// those change several times per write, and waking for each cost the leader ~10% more
    /// CPU per single-shard registration.
    pub async fn stopped(&self) -> String {
        let mut tick = tokio::time::interval(STOP_CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.inner.shut.load(Ordering::Acquire) {
                return std::future::pending().await;
            }
            if let Some(why) = self.core_failure() {
                return why;
            }
        }
    }

    /// How long a leader may go without a quorum acknowledging it before it no longer counts
    /// as leader (openraft's lease is the maximum election timeout).
    fn lease(&self) -> Duration {
        Duration::from_millis(self.inner.cfg.election_max_ms)
    }

    /// How long a write or read keeps retrying openraft's lease refusal before answering
    /// [`Error::NoLeader`]: a fresh leader's first quorum acknowledgement comes within a few
    /// heartbeats, an isolated leader's never does.
    fn lease_wait(&self) -> Duration {
        self.lease() * 2
    }

    /// Maps openraft's routing information to [`Error::ForwardToLeader`] (or `NoLeader`).
    fn forward(&self, f: &ForwardToLeader<TypeConfig>) -> Error {
        // Openraft names the leader once this node's vote is committed; until then the metrics
        // may already know it.
        let leader = f
            .leader_id
            .or_else(|| self.inner.raft.metrics().borrow_watched().current_leader);
        let Some(leader) = leader else {
            return Error::NoLeader;
        };
        let addr = f.leader_node.as_ref().map(|n| n.addr.clone()).or_else(|| {
            let m = self
                .inner
                .raft
                .metrics()
                .borrow_watched()
                .membership_config
                .clone();
            m.get_node(&leader).map(|n| n.addr.clone())
        });
        match addr {
            Some(leader_addr) if leader != self.id() => Error::ForwardToLeader {
                leader_id: leader,
                leader_addr,
            },
            _ => Error::NoLeader,
        }
    }

    /// `ForwardToLeader` when this node's metrics already name another node as leader, so a
    /// follower forwards a request without a round trip through its Raft core. `None`: this
    /// node may lead; ask the core (which answers `ForwardToLeader` itself if it does not).
    fn leader_elsewhere(&self) -> Option<Error> {
        self.leader_to_forward_to()
            .map(|(leader_id, leader_addr)| Error::ForwardToLeader {
                leader_id,
                leader_addr,
            })
    }

    /// Checks `cmd` as [`MetaNode::write`] would ([`Error::InvalidArgument`] for bad input) and
    /// says where it should be proposed: `Ok(None)` here (this node may lead, or knows no
    /// leader: `write` asks the Raft core), `Ok(Some((id, addr)))` at the leader this node's
    /// metrics name. Changes nothing.
    pub fn route(&self, cmd: &Command) -> Result<Option<(NodeId, String)>> {
        self.check_open()?;
        validate(cmd)?;
        Ok(self.leader_to_forward_to())
    }

    /// The leader (id and address) this node's metrics name, when that is another node.
    fn leader_to_forward_to(&self) -> Option<(NodeId, String)> {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        if m.state == openraft::ServerState::Leader {
            return None;
        }
        let leader = m.current_leader.filter(|l| *l != self.id())?;
        let node = m.membership_config.membership().get_node(&leader)?;
        Some((leader, node.addr.clone()))
    }

    /// Maps openraft's `Fatal` (its core stopped: shut down, storage failure or panic) to
    /// [`Error::Shutdown`]: the node serves no more Raft requests until restarted.
    fn fatal(&self, e: impl std::fmt::Display) -> Error {
        if !self.inner.shut.load(Ordering::Acquire) {
            tracing::error!("raft core stopped: {e}");
        }
        Error::Shutdown
    }

    fn write_error(&self, e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Error {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => self.forward(&f),
            RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => {
                Error::OutcomeUnknown(format!(
                    "entry discarded on leader change (leader now {:?})",
                    f.leader_id
                ))
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                Error::InvalidArgument(e.to_string())
            }
            RaftError::APIError(other) => Error::Raft(other.to_string()),
            RaftError::Fatal(f) => self.fatal(f),
        }
    }

    /// Whether openraft refused because this leader's lease is not (yet, or any more) backed by
    /// a quorum: a fresh leader answers so until its first quorum acknowledgement.
    fn lease_refusal(e: &RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> bool {
        matches!(
            e,
            RaftError::APIError(ClientWriteError::ForwardToLeader(f))
                if f.reason == openraft::error::ForwardReason::LeaseExpired && f.leader_id.is_none()
        )
    }

    /// Waits (at most until `deadline`, and at most 100 ms) for the Raft metrics to change.
    async fn await_metrics_change(&self, deadline: tokio::time::Instant) -> Result<()> {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout);
        }
        let mut rx = self.inner.raft.metrics();
        let until = deadline.min(tokio::time::Instant::now() + Duration::from_millis(100));
        let _ = tokio::time::timeout_at(until, rx.changed()).await;
        Ok(())
    }

    /// Runs `call` until it answers something other than openraft's lease refusal (a fresh
    /// leader waiting for its first quorum acknowledgement, `is_lease_refusal`), for at most
    /// [`MetaNode::lease_wait`] (then [`Error::NoLeader`]) and at most the request timeout (then
    /// [`Error::Timeout`]). Returns that other answer.
    async fn retry_lease_refusal<T, E, F, Fut>(
        &self,
        mut call: F,
        is_lease_refusal: impl Fn(&E) -> bool,
    ) -> Result<std::result::Result<T, E>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>>,
    {
        let now = tokio::time::Instant::now();
        let deadline = now + self.inner.cfg.request_timeout;
        let lease_deadline = deadline.min(now + self.lease_wait());
        loop {
            let res = tokio::time::timeout_at(deadline, call())
                .await
                .map_err(|_| Error::Timeout)?;
            match res {
                Err(e) if is_lease_refusal(&e) => {
                    if tokio::time::Instant::now() >= lease_deadline {
                        return Err(Error::NoLeader);
                    }
                    let _ = self.await_metrics_change(lease_deadline).await;
                }
                other => return Ok(other),
            }
        }
    }

    /// Runs a client-write-like call through [`MetaNode::retry_lease_refusal`].
    async fn leader_call<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<
            Output = std::result::Result<T, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>,
        >,
    {
        self.retry_lease_refusal(call, Self::lease_refusal)
            .await?
            .map_err(|e| self.write_error(e))
    }

    /// Proposes `cmd` and returns once it is committed (durable on a quorum) and applied here.
    /// On a follower: [`Error::ForwardToLeader`]. Bad input: [`Error::InvalidArgument`], nothing
    /// proposed.
    ///
    /// Writes wait for room in the admission window (`max_pending_shards`) before they are
    /// proposed, for at most the request timeout ([`Error::Timeout`]); the write itself then has
    /// the request timeout again.
    pub async fn write(&self, cmd: Command) -> Result<Written> {
        self.check_open()?;
        validate(&cmd)?;
        if let Some(forward) = self.leader_elsewhere() {
            return Err(forward);
        }
        let window = self.inner.cfg.max_pending_shards;
        let weight = cmd.weight().clamp(1, window);
        let deadline = tokio::time::Instant::now() + self.inner.cfg.request_timeout;
        let _room = tokio::time::timeout_at(deadline, self.inner.write_window.acquire_many(weight))
            .await
            .map_err(|_| Error::Timeout)?
            .map_err(|_| Error::Shutdown)?;
        let raft = &self.inner.raft;
        let r = self.leader_call(|| raft.client_write(cmd.clone())).await?;
        Ok(Written {
            index: r.log_id.index,
            result: r.data,
        })
    }

    /// Registers (or re-registers) a datanode; the result carries its new epoch.
    pub async fn register_datanode(&self, id: u64, addr: impl Into<String>) -> Result<Written> {
        self.write(Command::RegisterDatanode {
            id,
            addr: addr.into(),
        })
        .await
    }

    /// Registers a batch of replicas of `datanode` under incarnation `epoch`.
    pub async fn register_shards(
        &self,
        datanode: u64,
        epoch: u64,
        shards: Vec<ShardReport>,
    ) -> Result<Written> {
        self.write(Command::RegisterShards {
            datanode,
            epoch,
            shards,
        })
        .await
    }

    /// Makes reads after it see every write committed before it was called (Linearizable:
    /// read index confirmed by a quorum, then wait until applied here; Lease: the same, with
    /// the quorum's last acknowledgement standing for the confirmation while the leader lease
    /// holds), or nothing (Local).
    pub async fn read_barrier(&self, c: Consistency) -> Result<()> {
        self.check_open()?;
        let option = match c {
            Consistency::Local => return Ok(()),
            Consistency::Linearizable => LinearizerOption::from(ReadPolicy::ReadIndex),
            // Any acknowledgement within the lease; else a heartbeat now, waited for as a
            // read index is.
            Consistency::Lease => LinearizerOption::new(None, true),
        };
        if let Some(forward) = self.leader_elsewhere() {
            return Err(forward);
        }
        use openraft::error::LinearizableReadError as L;
        let raft = &self.inner.raft;
        let timeout = self.inner.cfg.request_timeout;
        let lin = self
            .retry_lease_refusal(
                || raft.get_read_linearizer(option.clone()),
                |e| {
                    matches!(e, RaftError::APIError(L::ForwardToLeader(f))
                        if f.reason == openraft::error::ForwardReason::LeaseExpired
                            && f.leader_id.is_none())
                },
            )
            .await?;
        let lin = match lin {
            Ok(l) => l,
            Err(RaftError::APIError(L::ForwardToLeader(f))) => return Err(self.forward(&f)),
            Err(RaftError::APIError(L::QuorumNotEnough(_))) => return Err(Error::NoLeader),
            Err(RaftError::Fatal(f)) => return Err(self.fatal(f)),
        };
        match lin.try_await_ready(raft, Some(timeout)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Timeout),
            Err(f) => Err(self.fatal(f)),
        }
    }

    /// Runs `f` on the registry once the read barrier of `c` passed, with every applied entry
    /// committed to the registry first (listings scan it).
    async fn read<T: Send + 'static>(
        &self,
        c: Consistency,
        f: impl FnOnce(&SmShared) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.read_point(c, move |sm| {
            sm.commit_deferred()?;
            f(sm)
        })
        .await
    }

    /// Like [`Self::read`] for `f` that reads single keys through the state machine's deferred
    /// batch (`SmShared::shard` and its kind): nothing is committed first.
    async fn read_point<T: Send + 'static>(
        &self,
        c: Consistency,
        f: impl FnOnce(&SmShared) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.read_barrier(c).await?;
        let sm = self.inner.sm.clone();
        blocking(move || f(&sm)).await
    }

    pub async fn datanode(&self, c: Consistency, id: u64) -> Result<Option<DatanodeInfo>> {
        self.read_point(c, move |sm| sm.datanode(id)).await
    }

    pub async fn datanodes(&self, c: Consistency) -> Result<Vec<DatanodeInfo>> {
        self.read(c, |sm| sm.registry.datanodes()).await
    }

    /// A shard's replica set; `None` if no datanode holds it.
    pub async fn shard(&self, c: Consistency, id: u64) -> Result<Option<ShardInfo>> {
        self.read_point(c, move |sm| sm.shard(id)).await
    }

    /// All replicas by (shard, datanode); `after` is the previous page's `next` cursor. At most
    /// `limit` items (capped at [`crate::MAX_PAGE`]; 0 is invalid).
    pub async fn shards(
        &self,
        c: Consistency,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ShardEntry>> {
        let after = after.map(str::to_string);
        self.read(c, move |sm| sm.registry.shards(after.as_deref(), limit))
            .await
    }

    /// One datanode's replicas by shard id, paginated like [`MetaNode::shards`].
    pub async fn datanode_shards(
        &self,
        c: Consistency,
        datanode: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<ShardEntry>> {
        let after = after.map(str::to_string);
        self.read(c, move |sm| {
            sm.registry
                .datanode_shards(datanode, after.as_deref(), limit)
        })
        .await
    }

    pub async fn kv_get(&self, c: Consistency, key: &str) -> Result<Option<KvEntry>> {
        check_key(key)?;
        let key = key.to_string();
        self.read_point(c, move |sm| sm.kv_get(&key)).await
    }

    /// Keys starting with `prefix` in byte order, paginated like [`MetaNode::shards`].
    pub async fn kv_list(
        &self,
        c: Consistency,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<KvKey>> {
        if prefix.len() > MAX_KEY_BYTES {
            return Err(Error::InvalidArgument("prefix too long".into()));
        }
        let (prefix, after) = (prefix.to_string(), after.map(str::to_string));
        self.read(c, move |sm| {
            sm.registry.kv_list(&prefix, after.as_deref(), limit)
        })
        .await
    }

    /// A digest of this node's registry content (datanodes, replicas, keys): number of records
    /// and a 64-bit FNV-1a hash. Replicas that applied the same log agree on it.
    pub async fn registry_digest(&self) -> Result<(u64, u64)> {
        let sm = self.inner.sm.clone();
        blocking(move || {
            sm.commit_deferred()?;
            let content = sm.registry.content()?;
            let mut h: u64 = 0xcbf29ce484222325;
            let mut feed = |b: &[u8]| {
                for &x in (b.len() as u32).to_le_bytes().iter().chain(b) {
                    h ^= x as u64;
                    h = h.wrapping_mul(0x100000001b3);
                }
            };
            for (k, v) in &content {
                feed(k);
                feed(v);
            }
            Ok((content.len() as u64, h))
        })
        .await
    }

    fn marker(&self) -> PathBuf {
        self.inner.cfg.data_dir.join(INITIALIZED)
    }

    /// Whether this node belongs to an initialized cluster (it initialized one, or holds any
    /// log, vote or membership).
    pub async fn is_initialized(&self) -> Result<bool> {
        self.check_open()?;
        if self.marker().exists() {
            return Ok(true);
        }
        self.inner
            .raft
            .is_initialized()
            .await
            .map_err(|e| self.fatal(e))
    }

    /// Forms a new cluster of `members` (which must include this node). Only ever once: a
    /// node that was initialized, or that holds any Raft state, answers
    /// [`Error::AlreadyInitialized`]; the fact is persisted in the data dir.
    pub async fn initialize(&self, members: BTreeMap<NodeId, Node>) -> Result<()> {
        if self.is_initialized().await? {
            return Err(Error::AlreadyInitialized);
        }
        if !members.contains_key(&self.id()) {
            return Err(Error::InvalidArgument(format!(
                "members {:?} must include this node ({})",
                members.keys().collect::<Vec<_>>(),
                self.id()
            )));
        }
        match self.inner.raft.initialize(members).await {
            Ok(()) => {}
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                return Err(Error::AlreadyInitialized)
            }
            Err(RaftError::APIError(e)) => return Err(Error::InvalidArgument(e.to_string())),
            Err(RaftError::Fatal(f)) => return Err(self.fatal(f)),
        }
        let marker = self.marker();
        let dir = self.inner.cfg.data_dir.clone();
        blocking(move || {
            std::fs::write(&marker, b"initialized\n")
                .and_then(|_| std::fs::File::open(&marker)?.sync_all())
                .map_err(|e| Error::io("write initialized marker", &marker, e))?;
            sync_dir(&dir)
        })
        .await
    }

    /// Adds (or re-adds) a learner and starts replicating to it; returns once the membership
    /// change is committed, without waiting for the learner to catch up.
    pub async fn add_learner(&self, id: NodeId, node: Node) -> Result<()> {
        self.check_open()?;
        if node.addr.is_empty() {
            return Err(Error::InvalidArgument("learner address is empty".into()));
        }
        let raft = &self.inner.raft;
        self.leader_call(|| raft.add_learner(id, node.clone(), false))
            .await
            .map(|_| ())
    }

    /// Makes `voters` the voting members (each must already be a member or learner); removed
    /// voters leave the cluster.
    pub async fn change_voters(&self, voters: BTreeSet<NodeId>) -> Result<()> {
        self.check_open()?;
        if voters.is_empty() {
            return Err(Error::InvalidArgument(
                "the voter set cannot be empty".into(),
            ));
        }
        let raft = &self.inner.raft;
        self.leader_call(|| {
            raft.change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), false)
        })
        .await
        .map(|_| ())
    }

    /// Builds a snapshot of everything applied so far (or returns the newest one if it is
    /// already that recent) and returns once it is durable.
    pub async fn snapshot_now(&self) -> Result<SnapshotInfo> {
        self.check_open()?;
        let raft = &self.inner.raft;
        // The state machine's own last-applied, not openraft's metrics, which may not yet show
        // a write already answered: the snapshot must cover every write answered before.
        let applied = self.inner.sm.applied().0;
        let asked = std::time::Instant::now();
        raft.trigger().snapshot().await.map_err(|e| self.fatal(e))?;
        let deadline = tokio::time::Instant::now() + self.inner.cfg.install_snapshot_timeout;
        loop {
            if raft.metrics().borrow_watched().snapshot >= applied {
                break;
            }
            // A build that failed while an older snapshot stands in does not advance the
            // metrics: report it rather than wait for the timeout.
            if let Some(why) = self.inner.sm.build_failed_since(asked) {
                return Err(Error::Snapshot(format!(
                    "building a snapshot failed: {why}"
                )));
            }
            self.check_open()?;
            self.await_metrics_change(deadline).await?;
        }
        self.inner
            .sm
            .last_snapshot()
            .ok_or_else(|| Error::Snapshot("no snapshot after building one".into()))
    }

    /// The newest complete snapshot file (for a backup download). Does no IO.
    pub fn newest_snapshot_file(&self) -> Option<PathBuf> {
        let (_, data) = self.inner.sm.current_snapshot()?;
        Some(data.path().to_path_buf())
    }

    /// Creates an empty file, in this node's data dir, for a snapshot a leader streams to it.
    /// The transport writes the snapshot file's bytes into it as received, then passes it to
    /// [`MetaNode::install_received_snapshot`]. Dropping it deletes the file.
    pub fn snapshot_receive_file(&self) -> Result<tempfile::TempPath> {
        tempfile::Builder::new()
            .prefix("incoming-")
            .tempfile_in(&self.inner.incoming)
            .map(|f| f.into_temp_path())
            .map_err(|e| Error::io("create incoming snapshot file", &self.inner.incoming, e))
    }

    /// Verifies a received snapshot file completely and hands it to Raft, which installs it
    /// if `vote` is still current (replacing the registry atomically). Answers like
    /// `Raft::install_full_snapshot`.
    pub async fn install_received_snapshot(
        &self,
        vote: Vote,
        file: tempfile::TempPath,
    ) -> Result<SnapshotResponse<TypeConfig>> {
        self.check_open()?;
        let (meta, data) = blocking(move || SnapshotData::open_received(file)).await?;
        self.inner
            .raft
            .install_full_snapshot(
                vote,
                openraft::storage::Snapshot {
                    meta,
                    snapshot: data,
                },
            )
            .await
            .map_err(|e| self.fatal(e))
    }

    /// Waits until this node applied `index` (for tests and tools).
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<()> {
        self.inner
            .raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .map(|_| ())
            .map_err(|e| match e {
                openraft::metrics::WaitError::Timeout(..) => Error::Timeout,
                openraft::metrics::WaitError::ShuttingDown => Error::Shutdown,
            })
    }

    /// This node's status.
    pub fn status(&self) -> ClusterStatus {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let nodes: BTreeMap<NodeId, String> = membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        let stopped = self.inner.shut.load(Ordering::Acquire) || self.core_stopped();
        // A leader no quorum acknowledged within the lease may be deposed already: it is not
        // reported as leader (a single voter is its own quorum).
        let self_quorum = membership.voter_ids().eq([self.id()]);
        let lost_quorum = m.state == openraft::ServerState::Leader
            && !self_quorum
            && m.last_quorum_acked
                .as_ref()
                .is_none_or(|t| openraft::Instant::elapsed(&**t) >= self.lease());
        let leader_id = if stopped || lost_quorum {
            None
        } else {
            m.current_leader
        };
        let leader_addr = leader_id.and_then(|l| nodes.get(&l).cloned());
        let last = m.last_log_index;
        let replication = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(node, matched)| {
                        let matched = matched.as_ref().map(|l| l.index);
                        let lag = match (last, matched) {
                            (Some(l), Some(mi)) => l.saturating_sub(mi),
                            (Some(l), None) => l + 1,
                            _ => 0,
                        };
                        ReplicationLag {
                            node: *node,
                            matched,
                            lag,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let sm = &self.inner.sm;
        let datanodes = sm.datanodes();
        let snapshot = sm.last_snapshot();
        let role = if stopped {
            Role::Shutdown
        } else if lost_quorum {
            Role::LeaderWithoutQuorum
        } else {
            Role::from(m.state)
        };
        ClusterStatus {
            id: self.id(),
            role,
            leader_id,
            leader_addr,
            term: m.current_term,
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            nodes,
            last_log_index: last,
            committed: m.local_committed.as_ref().map(|l| l.index),
            applied: m.last_applied.as_ref().map(|l| l.index),
            purged: m.purged.as_ref().map(|l| l.index),
            snapshot_index: m.snapshot.as_ref().map(|l| l.index),
            snapshot_bytes: snapshot.map(|s| s.bytes),
            replication,
            datanodes,
            replicas: sm.replicas(),
            wal: self.inner.log.wal_metrics(),
            state_machine: sm.stats.snapshot(),
            snapshot_rate: sm.limiter.rate(),
            snapshot_throttle_pauses: sm.limiter.pauses(),
            snapshot_throttle_millis: sm.limiter.paused_nanos() / 1_000_000,
        }
    }

    /// Clears the longest-apply and longest-builder-start figures (benchmarks).
    pub fn reset_apply_maxima(&self) {
        self.inner.sm.stats.reset_maxima();
    }

    /// Changes the snapshot export pace (bytes per second, 0 = unlimited), effective at the
    /// running export's next pause.
    pub fn set_snapshot_rate(&self, bytes_per_sec: u64) {
        self.inner.sm.limiter.set_rate(bytes_per_sec);
    }

    pub fn snapshot_rate(&self) -> u64 {
        self.inner.sm.limiter.rate()
    }

    /// Switches the WAL between shared barriers and one barrier per log entry (benchmarks).
    pub fn set_barrier_mode(&self, mode: meta_store::BarrierMode) {
        self.inner.log.wal().set_barrier_mode(mode);
    }

    /// Stops Raft, makes the log durable and flushes the registry. Later calls answer
    /// [`Error::Shutdown`].
    pub async fn shutdown(&self) -> Result<()> {
        if self.inner.shut.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // A snapshot export openraft runs detached stops at its next chunk (its temp file
        // is discarded) instead of running on after the node is gone.
        self.inner.sm.closing.store(true, Ordering::Release);
        // A core that already stopped (a fatal error) cannot be shut down, but the log and the
        // registry below still close and flush.
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!("shutting the Raft core down: {e}");
        }
        let inner = self.inner.clone();
        blocking(move || {
            inner.log.flush_committed()?;
            inner
                .log
                .wal()
                .close()
                .map_err(|e| Error::storage("close log", e))?;
            // Applied writes still deferred are committed; if that fails, the log still holds
            // their entries and the next start applies them again.
            if let Err(e) = inner.sm.commit_deferred() {
                tracing::warn!("applied writes not committed at shutdown: {e}");
            }
            inner.sm.registry.flush()?;
            // The log is closed and the registry flushed: another open of the dir may start
            // (sled releases its own lock when the last handle to this node is dropped).
            inner.dir_lock.lock().take();
            Ok(())
        })
        .await
    }
}
