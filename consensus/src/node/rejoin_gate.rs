//! The rejoin gate: while this node rejoins (`rejoin_marker.rs`), it acknowledges no leader's
//! message (AppendEntries, snapshots) until it has learned the cluster's term from enough of
//! the other voters (`term_probe.rs`), and from then on only those of a leader of that term or
//! a newer one. A message refused before the probe ends is answered with an error, so the
//! leader counts this node as unreachable for now and its acknowledgement helps no commit.
//!
//! After the probe, a deposed leader (its term older than the newest term a quorum could have
//! elected) is refused for good, and answered as a member that kept its data answers a leader
//! of an older term: with a higher vote (this node's, in the learned term), on which the leader
//! steps down. It stores that vote, which only narrows whom it may vote for, and a new
//! election follows, whose leader this node admits (a leader that keeps a quorum elsewhere,
//! of five voters, would otherwise lead on, refused here, until some other election).
//!
//! A leader elected later needs the votes of a quorum, and this node gives none while it
//! rejoins, so a leader of the learned term or a newer one can be deposed after the probe only
//! by a quorum of the others: then Raft's own argument holds, as it does for a node that never
//! lost its data. The cost: the node rejoins only once it heard from enough voters (both
//! others, in a cluster of three), so a new cluster's first entries commit once all its
//! members answer, and a voter that lost its data dir waits for the members that are down.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::vote::RaftLeaderId;

use super::MetaNode;
use crate::error::{Error, Result};
use crate::status::RejoinStatus;
use crate::term_probe::{heard_enough, TermAnswer, TermProbe};
use crate::types::{NodeId, Vote};

/// How long each member has to answer a probe.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a message waits for a probe to end: the leader's answer, then the others'.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// At most this many members' addresses are kept from their messages.
const MAX_ADDRESSES: usize = 64;

/// What the gate knows (`Inner::rejoin_gate`).
pub(crate) struct RejoinGate {
    /// The newest term that the members answered with, once enough of them did.
    floor: Option<u64>,
    /// A probe runs; the next message starts one otherwise.
    probing: bool,
    /// Counts the probes that ended, for the messages that wait for one.
    probed: tokio::sync::watch::Sender<u64>,
    probe: Arc<dyn TermProbe>,
    /// The members' addresses, as their messages named them (the HTTP transport needs them).
    addrs: BTreeMap<NodeId, String>,
    /// Why the last probe fell short, as last logged (logged again only when it changes).
    warned: Option<String>,
}

impl RejoinGate {
    pub(crate) fn new(probe: Arc<dyn TermProbe>) -> Self {
        RejoinGate {
            floor: None,
            probing: false,
            probed: tokio::sync::watch::Sender::new(0),
            probe,
            addrs: BTreeMap::new(),
            warned: None,
        }
    }

    /// The answer to a message of `leader` in `term`, once the floor is known; `me` is this
    /// node.
    fn verdict(&self, me: NodeId, term: u64, leader: NodeId) -> Option<Result<()>> {
        let floor = self.floor?;
        Some(if term >= floor {
            Ok(())
        } else {
            Err(Error::Deposed {
                leader,
                term,
                floor,
                higher: Vote::new(floor, me),
            })
        })
    }
}

impl MetaNode {
    /// Admits a message from the leader whose vote is `vote`. Called before openraft sees an
    /// AppendEntries request or a snapshot (a transport may call it first, to refuse a
    /// snapshot before its bytes arrive). Always `Ok` once this node holds the cluster's log;
    /// while it rejoins, only once it has learned the cluster's term from enough voters and the
    /// leader's term is not older. The first message starts the probe and waits for it (at
    /// most 5 s), so that a new member takes its first leader's message at once
    /// when every member answers. [`Error::Rejoining`] otherwise, or [`Error::Deposed`] for a
    /// leader of a term older than the one learned: the message must be refused,
    /// unacknowledged (a deposed leader with the higher vote the error carries). An admitted
    /// message counts as word from the leader (`node/leader_contact.rs`).
    pub async fn admit_leader(&self, vote: &Vote) -> Result<()> {
        self.admit_rejoining(vote).await?;
        let leader = *vote.leader_id().node_id();
        self.inner
            .leader_contact
            .lock()
            .note(leader, std::time::Instant::now());
        Ok(())
    }

    /// The rejoin's part of [`Self::admit_leader`].
    async fn admit_rejoining(&self, vote: &Vote) -> Result<()> {
        if !self.is_rejoining() {
            return Ok(());
        }
        let term = vote.leader_id().term;
        let leader = *vote.leader_id().node_id();
        let mut probed = {
            let mut gate = self.inner.rejoin_gate.lock();
            if let Some(verdict) = gate.verdict(self.id(), term, leader) {
                return verdict;
            }
            if !gate.probing {
                gate.probing = true;
                let addr = gate.addrs.get(&leader).cloned();
                self.spawn_term_probe(gate.probe.clone(), leader, addr);
            }
            // Subscribed under the lock: the probe's end, which takes it, is not missed.
            gate.probed.subscribe()
        };
        tokio::select! {
            _ = tokio::time::timeout(PROBE_WAIT, probed.changed()) => {}
            _ = self.closing() => {}
        }
        let gate = self.inner.rejoin_gate.lock();
        gate.verdict(self.id(), term, leader).unwrap_or_else(|| {
            Err(Error::Rejoining(format!(
                "this node started with no Raft state and acknowledges no leader until enough \
                 of the other voters told it the cluster's term{}",
                gate.warned
                    .as_ref()
                    .map(|why| format!(": {why}"))
                    .unwrap_or_default()
            )))
        })
    }

    /// Admits an AppendEntries request of the leader whose vote is `vote` ([`Self::admit_leader`])
    /// and then notes its commit index `leader_commit` for the rejoin (`node/votes.rs`).
    /// [`Error::Shutdown`] once this node shuts down or its core stopped: openraft would
    /// refuse the request too, logging an error for each.
    pub(super) async fn admit_append(&self, vote: &Vote, leader_commit: Option<u64>) -> Result<()> {
        self.check_open()?;
        self.admit_leader(vote).await?;
        self.note_leader_commit(vote, leader_commit);
        Ok(())
    }

    /// Whether this node rejoins: it started with no Raft state and does not hold the
    /// cluster's log yet (`rejoin_marker.rs`).
    pub fn is_rejoining(&self) -> bool {
        self.inner.rejoining.load(Ordering::Acquire)
    }

    /// [`Error::Rejoining`] saying why this node, holding no membership yet, waits: a leader
    /// contacted it and too few voters told it the cluster's term, or no leader reached it yet
    /// but it knows its cluster. `None` for a node that knows no cluster (it is in none yet).
    pub(super) fn rejoin_wait(&self) -> Option<Error> {
        if !self.is_rejoining() {
            return None;
        }
        let Some(why) = self.inner.rejoin_gate.lock().warned.clone() else {
            // No leader reached it yet, but it knows its cluster (a member's message, or the
            // question asked before it was added, gave it the id): it waits for that cluster.
            // The id itself stays secret.
            self.cluster_id()?;
            return Some(Error::Rejoining(
                "this node holds no Raft state (it is new, or its data dir was lost) and \
                 belongs to a cluster: it waits for that cluster's leader to reach it, which \
                 takes enough of the cluster's voters up; it needs no --init or init request"
                    .into(),
            ));
        };
        Some(Error::Rejoining(format!(
            "this node holds no Raft state (it is new, or its data dir was lost) and a leader \
             of its cluster contacted it: it acknowledges no leader until enough of the other \
             voters tell it the cluster's term ({why}); it needs no --init or init request"
        )))
    }

    /// What this node learned of the cluster's term while it rejoins; `None` otherwise.
    pub(super) fn rejoin_status(&self) -> Option<RejoinStatus> {
        if !self.is_rejoining() {
            return None;
        }
        let gate = self.inner.rejoin_gate.lock();
        Some(RejoinStatus {
            term_floor: gate.floor,
            // Cleared once the floor is known.
            waiting: gate.warned.clone(),
            knows_cluster: self.cluster_id().is_some(),
        })
    }

    /// Notes member `id`'s address as its message named it, while this node rejoins (the
    /// transport calls this; the probe asks the leader there).
    pub fn note_member_address(&self, id: NodeId, addr: &str) {
        if !self.is_rejoining() {
            return;
        }
        let mut gate = self.inner.rejoin_gate.lock();
        if gate.addrs.len() < MAX_ADDRESSES || gate.addrs.contains_key(&id) {
            gate.addrs.insert(id, addr.to_string());
        }
    }

    /// The address member `id`'s own messages named, while this node rejoins.
    pub(super) fn noted_address(&self, id: NodeId) -> Option<String> {
        if !self.is_rejoining() {
            return None;
        }
        self.inner.rejoin_gate.lock().addrs.get(&id).cloned()
    }

    /// This node's answer to a rejoining member's probe: its term and its membership.
    pub fn term_answer(&self) -> TermAnswer {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        TermAnswer {
            term: m.vote.leader_id().term,
            voters: membership.get_joint_config().clone(),
            addrs: membership
                .nodes()
                .map(|(id, node)| (*id, node.addr.clone()))
                .collect(),
        }
    }

    /// Asks the leader, then the voters its membership names, for their terms, and records
    /// the newest once enough voters answered (`term_probe::heard_enough`).
    fn spawn_term_probe(&self, probe: Arc<dyn TermProbe>, leader: NodeId, addr: Option<String>) {
        let me = self.id();
        // A weak handle: a node shut down meanwhile is not kept alive for this.
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let learned = learn_term(&*probe, me, leader, addr).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let mut gate = inner.rejoin_gate.lock();
            gate.probing = false;
            gate.probed.send_modify(|n| *n += 1);
            match learned {
                Ok(term) => {
                    tracing::info!(
                        term,
                        "enough voters told this node the cluster's term: it acknowledges \
                         leaders of that term or newer (a node that starts with no Raft state, \
                         new or with its data dir lost, first asks)"
                    );
                    gate.floor = Some(term);
                    gate.warned = None;
                }
                Err(why) if gate.warned.as_ref() != Some(&why) => {
                    tracing::warn!(
                        "this node started with no Raft state and acknowledges no leader until \
                         enough of the other voters tell it the cluster's term: {why}"
                    );
                    gate.warned = Some(why);
                }
                Err(why) => tracing::debug!("rejoin probe: {why}"),
            }
        });
    }
}

/// Asks `leader`, then every other voter its membership names, for their terms; the newest, if
/// `me` heard from enough voters.
async fn learn_term(
    probe: &dyn TermProbe,
    me: NodeId,
    leader: NodeId,
    addr: Option<String>,
) -> std::result::Result<u64, String> {
    let first = ask(probe, leader, addr)
        .await
        .map_err(|e| format!("the leader, node {leader}, did not answer ({e})"))?;
    // Only a member that holds its cluster's state names itself as a voter (a node that lost
    // its data dir too answers with no membership: it is no longer the leader that sent).
    if !first.voters.iter().any(|set| set.contains(&leader)) {
        return Err(format!(
            "node {leader}, the leader that reached this node, answered with a membership that \
             does not make it a voter ({:?})",
            first.voters
        ));
    }
    let others: BTreeSet<NodeId> = first
        .voters
        .iter()
        .flatten()
        .copied()
        .filter(|v| *v != me && *v != leader)
        .collect();
    let asks = others.iter().map(|id| {
        let answer = ask(probe, *id, first.addrs.get(id).cloned());
        async move { (*id, answer.await) }
    });
    let mut terms = BTreeMap::from([(leader, first.term)]);
    let mut silent = Vec::new();
    for (id, answer) in futures::future::join_all(asks).await {
        match answer {
            Ok(answer) => {
                terms.insert(id, answer.term);
            }
            Err(e) => silent.push(format!("node {id}: {e}")),
        }
    }
    let heard: BTreeSet<NodeId> = terms.keys().copied().collect();
    if !heard_enough(me, &first.voters, &heard) {
        return Err(format!(
            "too few voters answered (voters {:?}, heard from {heard:?}; {})",
            first.voters,
            silent.join("; ")
        ));
    }
    Ok(terms.into_values().max().unwrap_or(0))
}

/// One question, bounded by [`ASK_TIMEOUT`].
async fn ask(
    probe: &dyn TermProbe,
    id: NodeId,
    addr: Option<String>,
) -> std::result::Result<TermAnswer, String> {
    match tokio::time::timeout(ASK_TIMEOUT, probe.ask(id, addr)).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {ASK_TIMEOUT:?}")),
    }
}
