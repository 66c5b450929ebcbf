//! A metaserver node: opens the log, the registry and Raft from a data dir, and offers the
//! API the HTTP layer and the binary use: writes (answering "forward to leader" on a
//! follower), reads with a consistency choice, membership, snapshots and status. This file
//! opens, reports and shuts down; the sub-modules hold the write and read paths, membership,
//! snapshots and the limits on commands.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meta_store::WalOptions;
use openraft::async_runtime::watch::WatchReceiver;
use openraft::network::NetSnapshot;
use openraft::RaftNetworkFactory;

use crate::config::NodeConfig;
use crate::data_dir::DataDirLock;
use crate::error::{Error, Result};
use crate::liveness::Liveness;
use crate::log_store::LogStore;
use crate::rejoin_marker::RejoinMarker;
use crate::snapshot_data::SnapshotData;
use crate::state_machine::SmShared;
use crate::term_probe::ProbeMembers;
use crate::types::{NodeId, Raft, TypeConfig};
use crate::uncancelled::{uncancelled, uncancelled_stream};

mod election_holds;
mod free_space;
mod handover;
mod heartbeats;
mod leader_contact;
mod leader_silence;
mod membership;
mod reads;
mod recovery;
mod rejoin_gate;
mod removal;
mod snapshots;
mod status_report;
pub(crate) mod validation;
mod versions;
mod votes;
mod watch;
mod writes;

#[cfg(test)]
mod close_tests;
#[cfg(test)]
mod wait_tests;

#[cfg(test)]
impl MetaNode {
    /// Initializes a cluster of node 1 alone (this node, at `local-1`) and waits until it
    /// leads.
    async fn lead_alone(&self) {
        self.initialize(std::collections::BTreeMap::from([(
            1,
            crate::Node::new("local-1"),
        )]))
        .await
        .unwrap();
        self.raft()
            .wait(Some(Duration::from_secs(20)))
            .current_leader(1, "node 1 leads")
            .await
            .unwrap();
    }
}

/// Marker file written once the cluster was initialized from this node.
const INITIALIZED: &str = "initialized";
/// Sub-directory where snapshots streamed from a leader land before they are installed.
const INCOMING: &str = "snapshots-incoming";
/// How long the shutdown waits for openraft's state machine worker to stop once the Raft
/// core did.
const SM_RELEASE_WAIT: Duration = Duration::from_secs(10);
/// How often [`MetaNode::stopped`] looks whether the Raft core ended.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(500);

struct Inner {
    cfg: NodeConfig,
    raft: Raft,
    sm: Arc<SmShared>,
    log: LogStore,
    incoming: PathBuf,
    shut: AtomicBool,
    /// Set once a planned stop began ([`MetaNode::hand_over_leadership`]).
    stopping: AtomicBool,
    /// When a refused vote was last logged as a warning (`node/votes.rs`).
    vote_refusal_warned: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Set by [`MetaNode::begin_close`].
    closing: tokio::sync::watch::Sender<bool>,
    /// The data dir's free bytes, and when they were read (`free_space.rs`).
    free_space: parking_lot::Mutex<Option<(std::time::Instant, u64)>>,
    /// When a refused snapshot was last logged as a warning (`free_space.rs`).
    room_warned: parking_lot::Mutex<Option<std::time::Instant>>,
    /// The last refusal of a snapshot for want of room, and when (`free_space.rs`).
    room_refused: parking_lot::Mutex<Option<(std::time::Instant, String)>>,
    /// Whether the last look for a voter with room to take the leadership (the HTTP layer's
    /// disk hand-over) found one, or none looked yet: a leader short of disk then refuses
    /// writes as one handing over (`no_leader`: ask again), not as one that stays short (507).
    room_elsewhere: std::sync::atomic::AtomicBool,
    /// The other voters short of disk, as the HTTP layer's disk look and the voters' alarms
    /// told this node while it leads (`free_space.rs`).
    voter_rooms: parking_lot::Mutex<crate::voter_rooms::VoterRooms>,
    /// Room for writes in flight (`max_pending_shards`, and the small writes' lane).
    admission: crate::admission::Admission,
    /// Completes once openraft's state machine worker dropped the state machine
    /// (`StateMachine::released`); taken by the shutdown, which waits for it.
    sm_released: parking_lot::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    /// The data dir's lock; released once `shutdown` has closed the log and flushed the registry.
    dir_lock: parking_lot::Mutex<Option<DataDirLock>>,
    /// The datanodes' heartbeats, while this node leads (`node/heartbeats.rs`).
    liveness: parking_lot::Mutex<Liveness>,
    /// Held while the leader raises the cluster's version or adds a learner
    /// (`node/versions.rs`).
    raising: tokio::sync::Mutex<()>,
    /// Held through each membership change, its checks included (`node/membership.rs`).
    changing: tokio::sync::Mutex<()>,
    /// The highest cluster version this node proposed a raise to (`node/versions.rs`).
    proposed_version: std::sync::atomic::AtomicU32,
    /// This node started with no Raft state and does not hold the cluster's log yet
    /// (`rejoin_marker.rs`): it votes for no candidate with a log, and stands for no election.
    rejoining: AtomicBool,
    /// While rejoining: the term of the newest leader that reached this node, and the commit
    /// index of that leader's first message (`None` until one did). The rejoin ends once this
    /// node has committed up to it in that term.
    rejoin_target: parking_lot::Mutex<Option<votes::RejoinTarget>>,
    /// While rejoining: what this node learned of the cluster's term (`node/rejoin_gate.rs`).
    rejoin_gate: parking_lot::Mutex<rejoin_gate::RejoinGate>,
    /// Until when this node votes for no candidate, because before it opened it may have
    /// given a leader a lease that lasts until then (`node/votes.rs`).
    lease_given_until: Option<std::time::Instant>,
    /// The term this node last led in, and when it took office then (as its metrics showed it):
    /// a member it has never heard from has been silent at least that long.
    led_since: parking_lot::Mutex<Option<(u64, std::time::Instant)>>,
    /// When this node last took a message of its leader (`node/leader_contact.rs`).
    leader_contact: parking_lot::Mutex<leader_contact::LeaderContact>,
    /// How many times this node noticed its leader fall silent (`node/leader_silence.rs`).
    silences: tokio::sync::watch::Sender<u64>,
    /// The term in which this node last asked a voter to take its leadership over (0: never).
    handed_over_in: AtomicU64,
    /// Why this node may not start elections now (`node/election_holds.rs`).
    election_holds: parking_lot::Mutex<election_holds::ElectionHolds>,
    /// A committed membership named this node, or it opened with one: one that leaves it out means
    /// it was removed, not that it is a learner still catching up (`node/votes.rs`).
    was_named: AtomicBool,
    /// One past the highest log index of a membership naming this node its only voter that a
    /// leader sent it while it rejoined (0: none): elections stay held until its metrics show
    /// that entry (`node/votes.rs`).
    sole_membership_end: AtomicU64,
}

/// The answers of [`MetaNode::stream_append`], in order.
pub type AppendAnswers = std::pin::Pin<
    Box<
        dyn futures::Stream<
                Item = std::result::Result<openraft::raft::StreamAppendResult<TypeConfig>, Error>,
            > + Send,
    >,
>;

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
    use meta_store::FileSystem;
    meta_store::OsFileSystem
        .sync_dir(dir)
        .map_err(|e| Error::io("fsync directory", dir, e))
}

impl MetaNode {
    /// Opens the node in `cfg.data_dir` (creating it if needed) and starts Raft with `network`.
    /// Recovers the log, the registry and, when the registry is behind the log's purge point,
    /// reloads it from the newest snapshot. Never initializes a cluster: see
    /// [`MetaNode::initialize`].
    pub async fn open<N>(cfg: NodeConfig, network: N) -> Result<MetaNode>
    where
        N: RaftNetworkFactory<TypeConfig> + ProbeMembers,
        N::Network: NetSnapshot<TypeConfig, SnapshotData = SnapshotData>,
    {
        cfg.validate()?;
        let probe = network.term_probe();
        let window = cfg.max_pending_shards;
        let datanode_timeout = cfg.datanode_timeout;
        let mut raft_config = cfg.raft_config()?;
        let c = cfg.clone();
        let (dir_lock, log, mut sm, incoming, rejoining, followed, repair) = blocking(move || {
            crate::data_dir::create(&c.data_dir)?;
            // The data dir's entry is durable before anything in it is relied on: a power loss
            // soon after a first start would otherwise lose the whole dir, votes included.
            let parent = c.data_dir.parent().filter(|p| !p.as_os_str().is_empty());
            sync_dir(parent.unwrap_or(Path::new(".")))?;
            // Before anything in the dir is touched: log recovery may cut a torn tail.
            let dir_lock = DataDirLock::acquire(&c.data_dir, c.id)?;
            c.cluster_id.load(&c.data_dir)?;
            let incoming = c.data_dir.join(INCOMING);
            if incoming.exists() {
                std::fs::remove_dir_all(&incoming)
                    .map_err(|e| Error::io("clear incoming snapshots", &incoming, e))?;
            }
            std::fs::create_dir_all(&incoming)
                .map_err(|e| Error::io("create incoming snapshots dir", &incoming, e))?;
            let wal_opts = WalOptions {
                segment_bytes: c.wal_segment_bytes,
                barrier: c.barrier,
                extra_sync_latency: c.emulated_sync_latency,
                ..WalOptions::default()
            };
            let wal_was_there = c.wal_dir().exists();
            let opened = recovery::open_log_and_registry(&c, wal_opts);
            // A refused start leaves no log dir it created, so that the operator's copy can be
            // put back in its place.
            let (log, sm, repair) = match opened {
                Err(e @ Error::LogBehindRegistry { .. }) if !wal_was_there => {
                    let _ = std::fs::remove_dir_all(c.wal_dir());
                    return Err(e);
                }
                opened => opened?,
            };
            // Before Raft starts (and once the registry was judged: a sole voter whose log lost
            // its vote refuses above): its first message from a leader gives the node a term.
            let marker = RejoinMarker::new(&c.data_dir);
            if log.holds_no_state() {
                marker.set()?;
            }
            let rejoining = marker.is_set();
            // The entries of the dirs made above (the log's and the snapshots' sync their own).
            sync_dir(&c.data_dir)?;
            // A cluster's version never goes back: an older build must not replay its log.
            sm.set_build_version(c.build_version);
            sm.set_build_room(crate::build_room::BuildRoom::new(
                c.free_space.clone(),
                c.data_dir.clone(),
                c.min_free_bytes,
            ));
            sm.shared().check_build(sm.shared().cluster_version())?;
            let followed = log.follows_another_leader(c.id);
            Ok((dir_lock, log, sm, incoming, rejoining, followed, repair))
        })
        .await?;
        recovery::repair(repair, &mut sm, &log).await?;
        // Counted from now, after the log was read: any lease this node gave ended earlier.
        let lease_given_until =
            followed.then(|| std::time::Instant::now() + cfg.election_timeout());
        let shared = sm.shared();
        shared.feed.set_capacity(cfg.watch_history);
        let sm_released = sm.released();
        // Openraft's startup reloads the registry from the newest snapshot when it is behind,
        // re-applies committed entries, and rebuilds a snapshot if the log was purged without
        // one; see `check_not_behind_purge` for the check that it did.
        // A rejoining node starts with elections off (`votes.rs` says when they come on):
        // openraft's switch starts as the holds say, before its core's first tick.
        let holds = election_holds::ElectionHolds {
            rejoin: rejoining,
            ..Default::default()
        };
        raft_config.enable_elect &= holds.may_elect();
        let raft = Raft::new(cfg.id, Arc::new(raft_config), network, log.clone(), sm)
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
                stopping: AtomicBool::new(false),
                vote_refusal_warned: parking_lot::Mutex::new(None),
                closing: tokio::sync::watch::Sender::new(false),
                free_space: parking_lot::Mutex::new(None),
                room_warned: parking_lot::Mutex::new(None),
                room_refused: parking_lot::Mutex::new(None),
                room_elsewhere: std::sync::atomic::AtomicBool::new(true),
                voter_rooms: parking_lot::Mutex::default(),
                admission: crate::admission::Admission::new(window),
                sm_released: parking_lot::Mutex::new(Some(sm_released)),
                dir_lock: parking_lot::Mutex::new(Some(dir_lock)),
                liveness: parking_lot::Mutex::new(Liveness::new(datanode_timeout)),
                raising: tokio::sync::Mutex::new(()),
                changing: tokio::sync::Mutex::new(()),
                proposed_version: std::sync::atomic::AtomicU32::new(0),
                rejoining: AtomicBool::new(rejoining),
                lease_given_until,
                rejoin_target: parking_lot::Mutex::new(None),
                rejoin_gate: parking_lot::Mutex::new(rejoin_gate::RejoinGate::new(probe)),
                election_holds: parking_lot::Mutex::new(holds),
                led_since: parking_lot::Mutex::new(None),
                leader_contact: parking_lot::Mutex::new(leader_contact::LeaderContact::new(
                    std::time::Instant::now(),
                )),
                silences: tokio::sync::watch::Sender::new(0),
                handed_over_in: AtomicU64::new(0),
                was_named: AtomicBool::new(false),
                sole_membership_end: AtomicU64::new(0),
            }),
        };
        if let Some(until) = lease_given_until {
            node.hold_elections_until(until);
        }
        node.check_not_behind_purge()?;
        node.await_loaded_metrics().await;
        node.note_membership_at_open();
        node.follow_metrics();
        node.tick_liveness();
        node.watch_leader_silence();
        node.rebuild_damaged_snapshots();
        if rejoining {
            node.end_rejoin_when_caught_up();
        }
        node.warn_if_short_of_space();
        Ok(node)
    }

    /// Keeps `NodeConfig::addresses` as this node's membership gives them, from its metrics,
    /// and logs each change of leader, until Raft stops (its metrics channel closes).
    fn follow_metrics(&self) {
        let addresses = self.inner.cfg.addresses.clone();
        // The server metrics change with the role, leader and membership only, not with every
        // write as the full metrics do.
        let mut metrics = self.inner.raft.server_metrics();
        // A weak handle: the task must not keep a node that shut down alive.
        let inner = Arc::downgrade(&self.inner);
        let me = self.id();
        tokio::spawn(async move {
            let mut seen = None;
            let mut leader = None;
            // The first look shows the leader this node's saved vote names, from its last run:
            // it may be down now (every member restarting), so it is not said to lead.
            let mut first = true;
            loop {
                {
                    let m = metrics.borrow_watched();
                    if m.state == openraft::ServerState::Leader {
                        let term = m.vote.leader_id().term;
                        let Some(inner) = inner.upgrade() else {
                            return;
                        };
                        let mut led = inner.led_since.lock();
                        if led.is_none_or(|(t, _)| t != term) {
                            let now = std::time::Instant::now();
                            *led = Some((term, now));
                            // Datanodes' heartbeats reach this node from now on.
                            inner.liveness.lock().lead(term, now);
                        }
                    }
                    if m.current_leader != leader {
                        leader = m.current_leader;
                        let term = m.vote.leader_id().term;
                        match leader {
                            Some(id) if first && id != me => tracing::info!(
                                term,
                                "node {id} led when this node last ran (not heard from since)"
                            ),
                            Some(id) => tracing::info!(term, "node {id} leads"),
                            None => tracing::info!(term, "no leader known"),
                        }
                    }
                    // Only a committed membership counts as naming this node (see
                    // `MetaNode::note_named`).
                    if let Some(inner) = inner.upgrade() {
                        let node = MetaNode { inner };
                        node.note_named(&m.committed_membership_config);
                        let now = std::time::Instant::now();
                        node.inner
                            .leader_contact
                            .lock()
                            .named(m.current_leader, now);
                    }
                    let config = &m.membership_config;
                    if seen != Some(*config.log_id()) {
                        seen = Some(*config.log_id());
                        addresses.set(
                            config
                                .membership()
                                .nodes()
                                .map(|(id, n)| (*id, n.addr.clone()))
                                .collect(),
                        );
                    }
                }
                first = false;
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Waits (at most 10 s) until openraft's metrics show what the log holds: its core
    /// publishes them a moment after `Raft::new` returns, and until then a restarted member
    /// reports no membership, so its status, its settings checks and its answers ("not a
    /// member") would be wrong.
    async fn await_loaded_metrics(&self) {
        if self.inner.log.summary().0.is_none() {
            return;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self
            .inner
            .raft
            .metrics()
            .borrow_watched()
            .last_log_index
            .is_none()
        {
            if self.await_metrics_change(deadline).await.is_err() {
                tracing::warn!("openraft has not published its state 10 s after it started");
                return;
            }
        }
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

    /// The cluster this node belongs to, if it knows one (see `cluster_id.rs`).
    pub fn cluster_id(&self) -> Option<u64> {
        self.inner.cfg.cluster_id.get()
    }

    /// Accepts a message from a member of cluster `id`: this node's cluster, or, for a node
    /// that knows none yet, the one it now belongs to (recorded durably before this returns).
    /// [`Error::OtherCluster`] otherwise: the message must be refused.
    pub async fn accept_cluster(&self, id: u64) -> Result<()> {
        match self.cluster_id() {
            Some(ours) if ours == id => Ok(()),
            Some(ours) => Err(Error::OtherCluster { ours, theirs: id }),
            None => {
                let cluster = self.inner.cfg.cluster_id.clone();
                let dir = self.inner.cfg.data_dir.clone();
                // Two members' messages may come at once: one of them records it, and says so.
                if blocking(move || cluster.adopt(&dir, id)).await? {
                    tracing::info!("this node belongs to cluster {id:016x} now");
                }
                Ok(())
            }
        }
    }

    /// The Raft handle, for its metrics and its triggers. Raft messages from the leader go
    /// through [`MetaNode::append_entries`], [`MetaNode::stream_append`],
    /// [`MetaNode::handle_transfer_leader`], [`MetaNode::vote`] and
    /// [`MetaNode::install_received_snapshot`], which a caller that gives up cannot cancel
    /// halfway (`uncancelled.rs`).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Hands the leader's AppendEntries request to openraft. [`Error::Rejoining`] while this
    /// node, rejoining, may not acknowledge that leader yet (`node/rejoin_gate.rs`), and a
    /// higher vote for a leader it learned was deposed; openraft did not see the request then.
    pub async fn append_entries(
        &self,
        rpc: openraft::raft::AppendEntriesRequest<TypeConfig>,
    ) -> Result<openraft::raft::AppendEntriesResponse<TypeConfig>> {
        let admitted = self
            .admit_append(&rpc.vote, rpc.leader_commit.map(|l| l.index))
            .await;
        if let Err(Error::Deposed { higher, .. }) = admitted {
            return Ok(openraft::raft::AppendEntriesResponse::HigherVote(higher));
        }
        admitted?;
        self.hold_before_sole_membership(votes::sole_membership_end(&rpc.entries, self.id()));
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.append_entries(rpc).await })
            .await
            .map_err(|e| Error::Raft(e.to_string()))
    }

    /// Hands the leader's request to take over leadership to openraft.
    pub async fn handle_transfer_leader(
        &self,
        rpc: openraft::raft::TransferLeaderRequest<TypeConfig>,
    ) -> std::result::Result<
        openraft::raft::TransferLeaderResponse<TypeConfig>,
        openraft::error::Fatal<TypeConfig>,
    > {
        let raft = self.inner.raft.clone();
        uncancelled(async move { raft.handle_transfer_leader(rpc).await }).await
    }

    /// Hands a stream of the leader's AppendEntries requests to openraft's pipelined
    /// `stream_append` and returns its answers, in order. Dropped before its end, the answers
    /// are drained to their end on a task of their own (`uncancelled.rs`); they end when the
    /// requests end or an answer ends the exchange.
    pub fn stream_append<S>(&self, requests: S) -> AppendAnswers
    where
        S: futures::Stream<Item = openraft::raft::AppendEntriesRequest<TypeConfig>>
            + Send
            + 'static,
    {
        use futures::StreamExt as _;
        // A weak handle: the stream must not keep a node that shut down alive.
        let inner = Arc::downgrade(&self.inner);
        let refused: Arc<parking_lot::Mutex<Option<Error>>> = Arc::default();
        let note = refused.clone();
        // A request this node may not acknowledge (`node/rejoin_gate.rs`) ends the requests,
        // unseen by openraft, and its refusal ends the answers: a higher vote for a deposed
        // leader, an error otherwise.
        let me = self.id();
        let requests = requests.take_while(move |rpc| {
            let (inner, note) = (inner.clone(), note.clone());
            let (vote, commit) = (rpc.vote, rpc.leader_commit.map(|l| l.index));
            let alone = votes::sole_membership_end(&rpc.entries, me);
            async move {
                let Some(inner) = inner.upgrade() else {
                    return false;
                };
                let node = MetaNode { inner };
                let refusal = node.admit_append(&vote, commit).await.err();
                let admitted = refusal.is_none();
                if admitted {
                    node.hold_before_sole_membership(alone);
                }
                *note.lock() = refusal;
                admitted
            }
        });
        let answers = uncancelled_stream(self.inner.raft.stream_append(requests))
            .map(|answer| answer.map_err(|fatal| Error::Raft(fatal.to_string())));
        let refusal = futures::stream::once(async move { refused.lock().take() }).filter_map(|e| {
            std::future::ready(e.map(|e| match e {
                Error::Deposed { higher, .. } => {
                    Ok(Err(openraft::raft::StreamAppendError::HigherVote(higher)))
                }
                e => Err(e),
            }))
        });
        Box::pin(answers.chain(refusal))
    }

    /// [`Error::Shutdown`] once the node is shut down, [`Error::Stopped`] (naming why) once its
    /// core stopped after a failure.
    fn check_open(&self) -> Result<()> {
        if self.inner.shut.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        match self.core_failure() {
            Some(why) => Err(Error::Stopped(why)),
            None => Ok(()),
        }
    }

    /// Whether openraft's core task ended (a fatal error or a panic).
    fn core_stopped(&self) -> bool {
        self.core_failure().is_some()
    }

    /// Why openraft's core task ended, if it did: its last metrics carry the fatal error, or
    /// its metrics channel is closed. A registry that failed a commit counts as such an end
    /// (a read's commit found the failure: the core learns of it only at the next apply, and
    /// meanwhile the node looked ready but answered every read with an error).
    fn core_failure(&self) -> Option<String> {
        use futures::FutureExt as _;
        // The core's own error first: when the log and the registry fail at once (a full
        // disk), it names the log's failure, which the registry's would hide.
        let mut rx = self.inner.raft.metrics();
        if let Err(fatal) = &rx.borrow_and_update().running_state {
            return Some(fatal.to_string());
        }
        if self.inner.sm.has_failed() {
            return Some(
                "the registry failed a write (a full disk?); the next start rebuilds it".into(),
            );
        }
        matches!(rx.changed().now_or_never(), Some(Err(_))).then(|| "the Raft core ended".into())
    }

    /// Waits until openraft's core task ends while the node is open (a fatal storage error or
    /// a panic: the node can then serve nothing until it is restarted) and returns why.
    /// Never returns for a node that is shut down instead.
    ///
    /// It looks every `STOP_CHECK_INTERVAL` rather than on every change of the metrics:
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
        self.inner.cfg.election_timeout()
    }

    /// How long a write or read keeps retrying openraft's lease refusal before answering
    /// [`Error::NoLeader`]: a fresh leader's first quorum acknowledgement comes within a few
    /// heartbeats, an isolated leader's never does.
    fn lease_wait(&self) -> Duration {
        self.lease() * 2
    }

    /// Maps openraft's `Fatal` (its core stopped: shut down, storage failure or panic) to
    /// [`Error::Shutdown`] when the node was shut down, else to [`Error::Stopped`] naming the
    /// failure: the node serves no more Raft requests until restarted.
    fn fatal(&self, e: impl std::fmt::Display) -> Error {
        self.log_core_stopped(&e);
        if self.inner.shut.load(Ordering::Acquire) {
            return Error::Shutdown;
        }
        Error::Stopped(self.core_failure().unwrap_or_else(|| e.to_string()))
    }

    /// What a call that found this node closed answers: [`Error::Shutdown`] once it is shut
    /// down (or while nothing says why it closes), [`Error::Stopped`] naming the failure once
    /// its core stopped after one.
    pub(crate) fn closed(&self) -> Error {
        if self.inner.shut.load(Ordering::Acquire) {
            return Error::Shutdown;
        }
        self.core_failure().map_or(Error::Shutdown, Error::Stopped)
    }

    /// Notes openraft's `Fatal` at debug level, once for each request it fails: the cause is
    /// the one [`MetaNode::stopped`] answers, which the node's owner logs once.
    fn log_core_stopped(&self, e: &dyn std::fmt::Display) {
        if !self.inner.shut.load(Ordering::Acquire) {
            tracing::debug!("raft core stopped: {e}");
        }
    }

    /// Clears the longest-apply and longest-builder-start figures (benchmarks).
    pub fn reset_apply_maxima(&self) {
        self.inner.sm.stats.reset_maxima();
    }

    /// Changes the snapshot pace (bytes per second, 0 = unlimited) of exports, downloads and
    /// snapshots streamed to members, effective at the next pause of each one running.
    pub fn set_snapshot_rate(&self, bytes_per_sec: u64) {
        self.inner.sm.limiter.set_rate(bytes_per_sec);
    }

    pub fn snapshot_rate(&self) -> u64 {
        self.inner.sm.limiter.rate()
    }

    /// Paces `reader` (a snapshot download) with the snapshot rate, sharing its budget with the
    /// exports: the member's snapshot IO together stays under the rate. Lifting or changing the
    /// rate, and closing the node, end a pause in progress.
    pub fn paced_snapshot_reader<R>(&self, reader: R) -> impl tokio::io::AsyncRead + Unpin
    where
        R: tokio::io::AsyncRead + Unpin,
    {
        self.inner.cfg.snapshot_pace.paced(reader)
    }

    /// Switches the WAL between shared barriers and one barrier per log entry (benchmarks).
    pub fn set_barrier_mode(&self, mode: meta_store::BarrierMode) {
        self.inner.log.wal().set_barrier_mode(mode);
    }

    /// Stops Raft, makes the log durable and flushes the registry. Later calls answer
    /// [`Error::Shutdown`].
    ///
    /// Contract: when this returns, no task of this node applies to the registry any more
    /// (openraft's state machine worker stopped, or it did not within a bounded wait, which is
    /// logged) and the data dir is released. sled's own lock on the registry goes with the last
    /// handle to this node.
    pub async fn shutdown(&self) -> Result<()> {
        if self.inner.shut.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // On a task of its own: a caller that gives up (a timeout) must not leave the node
        // half closed, its log open and its dir locked, with every later call answering that
        // it is shut down.
        let node = self.clone();
        match tokio::spawn(async move { node.close().await }).await {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::Shutdown),
        }
    }

    /// The steps of [`MetaNode::shutdown`].
    async fn close(&self) -> Result<()> {
        self.begin_close();
        // A snapshot export openraft runs detached stops at its next chunk (its temp file
        // is discarded) instead of running on after the node is gone. Lifting the rate ends
        // the pause it may be sleeping in, however slow the rate was.
        self.inner.sm.closing.store(true, Ordering::Release);
        self.inner.sm.limiter.set_rate(0);
        // A core that already stopped (a fatal error) cannot be shut down, but the log and the
        // registry below still close and flush.
        // On a task of its own so that a panic there (openraft's, see `uncancelled.rs`) is
        // reported, not passed on: the log and the registry still close.
        let raft = self.inner.raft.clone();
        match tokio::spawn(async move { raft.shutdown().await }).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("shutting the Raft core down: {e}"),
            Err(e) => tracing::error!("shutting the Raft core down: {e}"),
        }
        // openraft's state machine worker outlives the core: it applies what was queued for it,
        // then drops the state machine. Nothing may apply once the deferred writes are committed
        // and the registry is marked closed below, and the worker's handle on the registry
        // would keep sled's lock on it after this node is gone: wait for it, for a bounded time.
        let released = self.inner.sm_released.lock().take();
        if let Some(released) = released {
            if tokio::time::timeout(SM_RELEASE_WAIT, released)
                .await
                .is_err()
            {
                tracing::warn!(
                    "openraft's state machine worker still runs {SM_RELEASE_WAIT:?} after the \
                     Raft core stopped; closing the registry regardless"
                );
            }
        }
        let inner = self.inner.clone();
        blocking(move || {
            // Snapshot builds openraft runs detached outlive its core: an export stops at its
            // next chunk (above), but one already finishing renames its file and retires older
            // ones. Wait for those, and refuse new ones, so that no snapshot file changes once
            // the dir is released below (a later open of it may rely on the snapshots it finds).
            inner.sm.snapshots.seal();
            // Every step runs even after one failed (a log whose disk failed): the close
            // stops the log's thread whatever its last barrier did, and a closed log writes
            // nothing more, so the dir may be opened again once it is closed.
            let flushed = inner.log.flush_committed();
            let closed = inner
                .log
                .wal()
                .close()
                .map_err(|e| Error::storage("close log", e));
            // Applied writes still deferred are committed; if that fails, the log still holds
            // their entries and the next start applies them again.
            if let Err(e) = inner.sm.commit_deferred() {
                tracing::warn!("applied writes not committed at shutdown: {e}");
            }
            let registry = inner.sm.registry.close();
            // The log is closed and the registry flushed (or failed): another open of the dir
            // may start (sled releases its own lock when the last handle to this node is
            // dropped, and an open waits for that). Before, a failed log kept the dir locked
            // until the last handle to this node was dropped, however long a caller held one.
            inner.dir_lock.lock().take();
            flushed?;
            closed?;
            registry
        })
        .await
    }
}
