//! The read path: the read barrier each consistency asks for, then point reads and listings
//! of the registry.

use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::RaftError;
use openraft::raft::linearizable_read::Linearizer;
use openraft::{LinearizerOption, ReadPolicy};

use super::validation::{check_key, MAX_KEY_BYTES};
use super::{blocking, MetaNode};
use crate::error::{Error, Result};
use crate::state_machine::SmShared;
use crate::types::TypeConfig;
use crate::uncancelled::uncancelled;
use crate::view::{Consistency, DatanodeInfo, KvEntry, KvKey, Page, ShardEntry, ShardInfo};

impl MetaNode {
    /// Makes reads after it see every write committed before it was called (Linearizable:
    /// read index confirmed by a quorum, then wait until applied here; Lease: the same, with
    /// the quorum's last acknowledgement standing for the confirmation while the leader lease
    /// holds), or nothing (Local). On a follower: [`Error::ForwardToLeader`]. On a node removed
    /// from the cluster: [`Error::Removed`], and on one its voters refuse as another cluster's:
    /// [`Error::RefusedByMembers`], for every consistency (nothing brings its state up to date
    /// again).
    pub async fn read_barrier(&self, c: Consistency) -> Result<()> {
        let Some(lin) = self.linearizer(c).await? else {
            return Ok(());
        };
        let raft = self.inner.raft.clone();
        let timeout = Some(self.inner.cfg.request_timeout);
        match uncancelled(async move { lin.try_await_ready(&raft, timeout).await }).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Timeout),
            Err(f) => Err(self.fatal(f)),
        }
    }

    /// The leader's half of a follower read: confirms that this node leads, as
    /// [`MetaNode::read_barrier`] does for `c`, and returns the read index: the log index a
    /// node must have applied before its state answers a read linearizably (every write
    /// committed before this call is at or below it). It does not wait until this node applied
    /// it. On a follower: [`Error::ForwardToLeader`]; for `Local`: [`Error::InvalidArgument`].
    pub async fn read_index(&self, c: Consistency) -> Result<u64> {
        match self.linearizer(c).await? {
            Some(lin) => Ok(lin.read_log_id().index()),
            None => Err(Error::InvalidArgument(
                "a local read needs no read index".into(),
            )),
        }
    }

    /// The follower's half of a follower read: waits until this node applied `index` (a read
    /// index from [`MetaNode::read_index`] at the leader), at most `timeout`
    /// ([`Error::Timeout`]). Reads with `Consistency::Local` after it are linearizable.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<()> {
        self.check_open()?;
        self.inner
            .raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .map(|_| ())
            .map_err(|e| match e {
                openraft::metrics::WaitError::Timeout(..) => Error::Timeout,
                openraft::metrics::WaitError::ShuttingDown => self.closed(),
            })
    }

    /// Committed entries this node knows of but has not applied yet (from openraft's
    /// metrics; no IO).
    pub fn apply_backlog(&self) -> u64 {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let committed = m.local_committed.as_ref().map_or(0, |l| l.index);
        let applied = m.last_applied.as_ref().map_or(0, |l| l.index);
        committed.saturating_sub(applied)
    }

    /// Confirms leadership as `c` asks and returns openraft's linearizer (its read index);
    /// `None` for `Local`, which needs none.
    async fn linearizer(&self, c: Consistency) -> Result<Option<Linearizer<TypeConfig>>> {
        self.check_open()?;
        self.check_serving()?;
        let option = match c {
            Consistency::Local => return Ok(None),
            Consistency::Linearizable => LinearizerOption::from(ReadPolicy::ReadIndex),
            // Any acknowledgement within the lease; else a heartbeat now, waited for as a
            // read index is.
            Consistency::Lease => LinearizerOption::new(None, true),
        };
        if let Some(forward) = self.leader_elsewhere() {
            return Err(forward);
        }
        // A leader no quorum acknowledged for two election timeouts (it is cut off) refuses at
        // once, as it does a write: a round of its own would wait out the lease for answers
        // that do not come. Not one that stood still lately: it has not read the
        // acknowledgements that wait for it yet.
        let acknowledged = self.unacknowledged_for().is_none();
        if !acknowledged && !self.stalled_lately() {
            return Err(Error::NoLeader);
        }
        use openraft::error::LinearizableReadError as L;
        // A read under way when this leader's quorum falls silent is refused then, as the
        // writes under way are told then (`leader_call`), not when its own round gives up.
        let asked = self.retry_lease_refusal(
            |raft| {
                let option = option.clone();
                async move { raft.get_read_linearizer(option).await }
            },
            // No leader known yet, or no quorum answered this node's round (a leader
            // that was paused finds the others moved on to a newer term): within a while
            // it learns the new leader, and the read goes there instead of failing.
            |e| match e {
                RaftError::APIError(L::ForwardToLeader(f)) => f.leader_id.is_none(),
                RaftError::APIError(L::QuorumNotEnough(_)) => true,
                _ => false,
            },
        );
        let lin = tokio::select! {
            lin = asked => lin?,
            _ = self.quorum_silenced(), if acknowledged => return Err(Error::NoLeader),
        };
        match lin {
            Ok(l) => Ok(Some(l)),
            Err(RaftError::APIError(L::ForwardToLeader(f))) => Err(self.forward(&f)),
            Err(RaftError::APIError(L::QuorumNotEnough(_))) => Err(Error::NoLeader),
            Err(RaftError::Fatal(f)) => Err(self.fatal(f)),
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

    /// Registered datanodes by id, paginated like [`MetaNode::shards`].
    pub async fn datanodes(
        &self,
        c: Consistency,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<DatanodeInfo>> {
        let after = after.map(str::to_string);
        self.read(c, move |sm| {
            sm.registry.datanode_page(after.as_deref(), limit)
        })
        .await
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

    /// A digest of this node's registry content (its primary data: datanodes, replicas, keys,
    /// epoch floors, settings): number
    /// of records and a 64-bit FNV-1a hash. Replicas that applied the same log agree on it.
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
}
