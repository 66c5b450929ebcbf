//! A three-node in-process cluster for tests: nodes over the in-process transport, each with
//! its own data dir, started, stopped and restarted from their dirs. Waits poll metrics with
//! deadlines; nothing sleeps to synchronize.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use meta_consensus::transport::LocalRouter;
use meta_consensus::{
    Command, CommandResult, MetaNode, Node, NodeConfig, NodeId, Role, ShardReport,
};
use openraft::async_runtime::watch::WatchReceiver;
use tempfile::TempDir;

/// How long a test waits for the cluster to reach a state.
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Cluster {
    pub router: LocalRouter,
    base: TempDir,
    pub nodes: BTreeMap<NodeId, MetaNode>,
    /// Applied to each node's configuration before it opens.
    pub tune: fn(&mut NodeConfig),
    /// The file system of each node's log, if not the operating system's.
    pub wal_fs: BTreeMap<NodeId, std::sync::Arc<dyn meta_store::FileSystem>>,
}

/// How many seeds a seeded test runs: `default`, or the number in the environment variable
/// `var` (for a longer search).
pub fn seed_count(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

pub fn addr(id: NodeId) -> String {
    format!("local-{id}")
}

fn no_tuning(_: &mut NodeConfig) {}

impl Cluster {
    /// An empty cluster (no node started).
    pub fn new() -> Result<Cluster> {
        Ok(Cluster {
            router: LocalRouter::new(),
            base: tempfile::tempdir()?,
            nodes: BTreeMap::new(),
            tune: no_tuning,
            wal_fs: BTreeMap::new(),
        })
    }

    /// Three nodes, initialized from node 1, with a leader elected.
    pub async fn three() -> Result<Cluster> {
        Self::three_tuned(no_tuning).await
    }

    pub async fn three_tuned(tune: fn(&mut NodeConfig)) -> Result<Cluster> {
        Self::formed(3, tune).await
    }

    /// Nodes 1 to `n`, initialized from node 1, with a leader elected.
    pub async fn voters(n: NodeId) -> Result<Cluster> {
        Self::formed(n, no_tuning).await
    }

    async fn formed(n: NodeId, tune: fn(&mut NodeConfig)) -> Result<Cluster> {
        let mut c = Cluster::new()?;
        c.tune = tune;
        for id in 1..=n {
            c.start(id).await?;
        }
        let members: BTreeMap<NodeId, Node> = (1..=n).map(|i| (i, Node::new(addr(i)))).collect();
        c.node(1).initialize(members).await?;
        c.converged().await?;
        Ok(c)
    }

    pub fn dir(&self, id: NodeId) -> PathBuf {
        self.base.path().join(format!("node-{id}"))
    }

    pub fn config(&self, id: NodeId) -> NodeConfig {
        let mut cfg = NodeConfig::new(id, addr(id), self.dir(id));
        cfg.heartbeat_ms = 100;
        cfg.election_min_ms = 700;
        cfg.election_max_ms = 1400;
        cfg.sled_cache_bytes = 4 << 20;
        cfg.wal_segment_bytes = 1 << 20;
        cfg.snapshot_logs_since_last = 0;
        cfg.request_timeout = Duration::from_secs(20);
        // In-process, a learner's build is known only once it was added (the HTTP layer asks it
        // before): the version rises only when a command needs it, so that learners may be
        // added before they answer. `cluster_version.rs` tests the raise at formation.
        cfg.raise_version_at_formation = false;
        cfg.wal_fs = self.wal_fs.get(&id).cloned();
        (self.tune)(&mut cfg);
        cfg
    }

    /// Opens node `id` from its data dir and makes it reachable.
    pub async fn start(&mut self, id: NodeId) -> Result<MetaNode> {
        let node = MetaNode::open(self.config(id), self.router.network(id))
            .await
            .with_context(|| format!("open node {id}"))?;
        self.router.register(node.clone());
        self.nodes.insert(id, node.clone());
        Ok(node)
    }

    /// Starts node `id`, which must refuse to (`what` says what it is, for the error when it
    /// starts), and answers the refusal, with its causes.
    pub async fn start_refused(&mut self, id: NodeId, what: &str) -> Result<String> {
        match self.start(id).await {
            Ok(_) => bail!("{what} started"),
            Err(e) => Ok(format!("{e:#}")),
        }
    }

    /// Makes node `id` unreachable and shuts it down (its data dir stays).
    pub async fn stop(&mut self, id: NodeId) -> Result<()> {
        self.router.unregister(id);
        if let Some(n) = self.nodes.remove(&id) {
            n.shutdown().await?;
        }
        Ok(())
    }

    /// Restarts `node` (its data dir kept) cut off from `leader`, at the point of its catch-up
    /// that `at` describes: waits until its metrics show `at`, cuts the link, restarts it, and
    /// checks that it opened there still (else the log it catches up on is too short).
    pub async fn restart_cut_off_at(
        &mut self,
        node: MetaNode,
        leader: NodeId,
        at: impl Fn(&openraft::RaftMetrics<meta_consensus::TypeConfig>) -> bool + Send + Sync,
        what: &str,
    ) -> Result<MetaNode> {
        let id = node.id();
        node.raft().wait(Some(WAIT)).metrics(&at, what).await?;
        self.router.cut(leader, id);
        // The registry's lock goes with the last handle to the node.
        drop(node);
        self.stop(id).await?;
        let node = self.start(id).await?;
        ensure!(
            at(&node.raft().metrics().borrow_watched()),
            "node {id} did not open {what} (the log it catches up on needs to be longer)"
        );
        Ok(node)
    }

    pub fn node(&self, id: NodeId) -> &MetaNode {
        &self.nodes[&id]
    }

    /// Waits until one running node is leader and every running node agrees on it.
    pub async fn leader(&self) -> Result<MetaNode> {
        let deadline = Instant::now() + WAIT;
        let mut rx: Vec<_> = self.nodes.values().map(|n| n.raft().metrics()).collect();
        loop {
            let statuses: Vec<_> = self.nodes.values().map(|n| n.status()).collect();
            let leaders: Vec<_> = statuses.iter().filter(|s| s.role == Role::Leader).collect();
            if let [l] = leaders.as_slice() {
                let agreed = statuses
                    .iter()
                    .filter(|s| {
                        !matches!(s.role, Role::Learner | Role::Removed | Role::Uninitialized)
                    })
                    .all(|s| s.leader_id == Some(l.id));
                if agreed {
                    return Ok(self.node(l.id).clone());
                }
            }
            if Instant::now() > deadline {
                bail!("no agreed leader after {WAIT:?}: {statuses:#?}");
            }
            // Wake on any metrics change (or re-check at least every 50 ms).
            let changed = futures::future::select_all(rx.iter_mut().map(|r| Box::pin(r.changed())));
            let _ = tokio::time::timeout(Duration::from_millis(50), changed).await;
        }
    }

    /// Waits until every running node applied at least `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<()> {
        for n in self.nodes.values() {
            n.wait_applied(index, WAIT)
                .await
                .with_context(|| format!("node {} applying {index}", n.id()))?;
        }
        Ok(())
    }

    /// Waits until every running node applied what the leader has, then checks that all
    /// registries hold the same content.
    pub async fn converged(&self) -> Result<(u64, u64)> {
        let leader = self.leader().await?;
        let last = leader.status().last_log_index.context("leader has a log")?;
        self.wait_applied(last).await?;
        let mut digests = BTreeMap::new();
        for (id, n) in &self.nodes {
            digests.insert(*id, n.registry_digest().await?);
        }
        let first = *digests.values().next().unwrap();
        if digests.values().any(|d| *d != first) {
            bail!("registries differ: {digests:?}");
        }
        Ok(first)
    }

    pub async fn shutdown(mut self) -> Result<()> {
        let ids: Vec<_> = self.nodes.keys().copied().collect();
        for id in ids {
            self.stop(id).await?;
        }
        Ok(())
    }
}

/// Removes datanode `id` through `leader` as the HTTP handler does: the removal, then the pieces
/// it asks for, each naming the incarnation the first found. Returns the replicas removed.
pub async fn remove_datanode(leader: &MetaNode, id: u64) -> Result<u64> {
    let mut written = leader.write(Command::RemoveDatanode { id }).await?;
    let mut removed = 0;
    loop {
        match written.result {
            CommandResult::DatanodeRemoved {
                existed: true,
                replicas_removed,
            } => return Ok(replicas_removed),
            CommandResult::RemovalPiece {
                removed: n,
                gone,
                registered_index,
            } => {
                removed += n;
                if gone {
                    return Ok(removed);
                }
                let piece = Command::RemoveDatanodePiece {
                    id,
                    registered_index: Some(registered_index),
                };
                written = leader.write(piece).await?;
            }
            other => bail!("removing datanode {id}: unexpected {other:?}"),
        }
    }
}

/// A report of shard `id` at `generation`, with a size made up from both.
pub fn shard(id: u64, generation: u64) -> ShardReport {
    ShardReport {
        id,
        generation,
        size: id * 10 + generation,
    }
}

/// Registers datanode `dn` and `n` shards on it (one command per shard); returns the epoch.
pub async fn register(leader: &MetaNode, dn: u64, shards: std::ops::Range<u64>) -> Result<u64> {
    let w = leader.register_datanode(dn, format!("dn-{dn}")).await?;
    let CommandResult::DatanodeRegistered { epoch, .. } = w.result else {
        anyhow::bail!("unexpected {:?}", w.result);
    };
    ensure!(epoch == w.index, "epoch is the command's log index");
    for s in shards {
        let w = leader.register_shards(dn, epoch, vec![shard(s, 1)]).await?;
        ensure!(
            w.result
                == CommandResult::ShardsRegistered {
                    accepted: 1,
                    unchanged: 0,
                    stale: vec![]
                },
            "{:?}",
            w.result
        );
    }
    Ok(epoch)
}

/// Checks that `n`'s own registry holds the keys `k/0` to `k/{count - 1}`.
pub async fn holds_keys(n: &MetaNode, count: usize) -> Result<()> {
    for i in 0..count {
        let key = format!("k/{i}");
        n.kv_get(meta_consensus::Consistency::Local, &key)
            .await?
            .with_context(|| format!("{key} was lost"))?;
    }
    Ok(())
}

/// The file in `dir` whose name ends in `.ext` and sorts last (log segments and snapshots are
/// named so that the newest sorts last).
pub fn newest_file(dir: &std::path::Path, ext: &str) -> Result<PathBuf> {
    std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .max()
        .with_context(|| format!("no .{ext} file in {}", dir.display()))
}
