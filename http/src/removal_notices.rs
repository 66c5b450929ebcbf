//! Tells the nodes that a committed membership change removed that they were removed. The
//! leader stops replicating to a node once the membership without it is appended, so the node
//! cannot learn it from the log; a removed voter learns it from the answers to its vote
//! requests, but a removed learner never asks for votes, and would report itself a learner for
//! ever.
//!
//! Every node follows its committed membership from when it starts ([`run`]); the leader sends
//! each node the last change left out a notice ([`PATH_REMOVED`]) until one is delivered, the
//! node refuses it (another node, or one that holds no cluster's data, answers there), or a
//! newer membership names the node again. A node that is down when it is removed is told once
//! it is back, and a change whose request timed out, or that a leader committed just before it
//! lost its leadership, is told too. Every node keeps its list in its data dir
//! (`MetaNode::keep_untold_removals`) whenever the nodes on it change, and starts from it: a
//! node removed while it was down is told once it is back, even if every member restarted
//! meanwhile. Best effort: a list that cannot be kept stays in memory, with a warning.
//!
//! [`RemovalNotices`] is the bookkeeping, plain code that tests drive with their own clock.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::ServerState;
use tokio::time::Instant;

use crate::cluster_identity::MEMBER_ONLY;
use crate::raft_routes::PATH_REMOVED;
use crate::state::AppState;

/// The pause before the second attempt to tell a node; it doubles per failed attempt.
pub const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest pause between two attempts: a removed node that comes back is told within it.
pub const MAX_RETRY: Duration = Duration::from_secs(10);

/// The nodes a committed membership change removed that are still to be told, and when to try
/// each next.
#[derive(Debug, Default)]
pub struct RemovalNotices {
    /// The committed membership last seen: node id to address.
    members: BTreeMap<u64, String>,
    untold: BTreeMap<u64, Untold>,
    /// Changes whenever a node joins or leaves `untold`.
    version: u64,
}

#[derive(Debug)]
struct Untold {
    addr: String,
    failures: u32,
    next: Instant,
    /// An attempt is under way: the node is not due again until it ends.
    sending: bool,
}

impl Untold {
    /// A node at `addr` to be told from `now` on.
    fn due(addr: String, now: Instant) -> Untold {
        Untold {
            addr,
            failures: 0,
            next: now,
            sending: false,
        }
    }
}

impl RemovalNotices {
    /// Starts from the committed membership `members`, with nobody to tell: the nodes earlier
    /// changes removed come from [`RemovalNotices::restore`].
    pub fn new(members: BTreeMap<u64, String>) -> Self {
        RemovalNotices {
            members,
            untold: BTreeMap::new(),
            version: 0,
        }
    }

    /// Adds the nodes (id to address) a former run of this node still had to tell, each due at
    /// `now`, except those the committed membership names (again).
    pub fn restore(&mut self, saved: BTreeMap<u64, String>, now: Instant) {
        for (id, addr) in saved {
            if !self.members.contains_key(&id) && !self.untold.contains_key(&id) {
                self.untold.insert(id, Untold::due(addr, now));
                self.version += 1;
            }
        }
    }

    /// The nodes (id to address) still to be told.
    pub fn untold(&self) -> BTreeMap<u64, String> {
        self.untold
            .iter()
            .map(|(id, u)| (*id, u.addr.clone()))
            .collect()
    }

    /// A number that changes whenever a node joins or leaves the nodes still to be told: equal
    /// numbers, equal [`RemovalNotices::untold`] lists.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The committed membership is now `members`: each node of the previous one that it leaves
    /// out is to be told at once, and a node it names (again) is not to be told.
    pub fn saw(&mut self, members: BTreeMap<u64, String>, now: Instant) {
        if members == self.members {
            return;
        }
        // An uninitialized node's empty membership removes nobody.
        if !members.is_empty() {
            for (id, addr) in &self.members {
                if !members.contains_key(id) {
                    self.untold.insert(*id, Untold::due(addr.clone(), now));
                    self.version += 1;
                }
            }
        }
        let before = self.untold.len();
        self.untold.retain(|id, _| !members.contains_key(id));
        if self.untold.len() != before {
            self.version += 1;
        }
        self.members = members;
    }

    /// The nodes (id, address) whose next attempt is due at `now`, now under way: none is due
    /// again until [`RemovalNotices::done`] or [`RemovalNotices::failed`] says how it ended.
    pub fn take_due(&mut self, now: Instant) -> Vec<(u64, String)> {
        self.untold
            .iter_mut()
            .filter(|(_, u)| !u.sending && u.next <= now)
            .map(|(id, u)| {
                u.sending = true;
                (*id, u.addr.clone())
            })
            .collect()
    }

    /// When the next attempt is due, if a node is still to be told and no attempt to tell it
    /// is under way.
    pub fn next_attempt(&self) -> Option<Instant> {
        self.untold
            .values()
            .filter(|u| !u.sending)
            .map(|u| u.next)
            .min()
    }

    /// Node `id` was told, refused the notice, or no longer needs it: it is not tried again.
    pub fn done(&mut self, id: u64) {
        if self.untold.remove(&id).is_some() {
            self.version += 1;
        }
    }

    /// The attempt to tell node `id` failed at `now`: the next is due after a pause that
    /// doubles per failure, from [`FIRST_RETRY`] up to [`MAX_RETRY`]. Returns the failures so
    /// far.
    pub fn failed(&mut self, id: u64, now: Instant) -> u32 {
        let Some(untold) = self.untold.get_mut(&id) else {
            return 0;
        };
        let pause = FIRST_RETRY
            .saturating_mul(1 << untold.failures.min(16))
            .min(MAX_RETRY);
        untold.failures += 1;
        untold.next = now + pause;
        untold.sending = false;
        untold.failures
    }

    /// Whether any node is still to be told.
    pub fn is_empty(&self) -> bool {
        self.untold.is_empty()
    }
}

/// Follows `state`'s node's committed membership and, while the node leads, tells the nodes
/// it removes, until the node begins to close or Raft stops. Spawn it once per node, next to
/// its HTTP server. Attempts run side by side: a node that does not answer holds up no other.
pub async fn run(state: AppState) {
    let node = state.node.clone();
    let closing = node.closing();
    tokio::pin!(closing);
    let mut metrics = node.raft().server_metrics();
    let (mut leads, members) = observe(&metrics.borrow_watched());
    let mut notices = RemovalNotices::new(members);
    match node.untold_removals().await {
        Ok(saved) => notices.restore(saved, Instant::now()),
        Err(e) => tracing::warn!("could not read the nodes still to be told of their removal: {e}"),
    }
    // The list in the data dir is that of this version (none: nothing kept yet this run).
    let mut kept = None;
    let mut sending = FuturesUnordered::new();
    loop {
        if kept != Some(notices.version()) {
            keep(&node, &notices).await;
            kept = Some(notices.version());
        }
        // A follower keeps its list (it may lead next) but tries nobody: becoming the leader
        // changes the server metrics, which wakes this loop.
        let wake = if leads { notices.next_attempt() } else { None };
        tokio::select! {
            _ = &mut closing => return,
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            Some((id, outcome)) = sending.next(), if !sending.is_empty() => {
                record(&mut notices, id, outcome);
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
        }
        let (now_leads, members) = observe(&metrics.borrow_watched());
        leads = now_leads;
        notices.saw(members, Instant::now());
        if leads {
            for (id, addr) in notices.take_due(Instant::now()) {
                sending.push(tell(state.clone(), id, addr));
            }
        }
    }
}

/// Keeps the nodes still to be told in the node's data dir; a failure is logged, not retried
/// until the nodes change (the list in memory still serves this run).
async fn keep(node: &meta_consensus::MetaNode, notices: &RemovalNotices) {
    if let Err(e) = node.keep_untold_removals(notices.untold()).await {
        tracing::warn!("could not keep the nodes still to be told of their removal: {e}");
    }
}

/// Records how an attempt to tell node `id` ended.
fn record(notices: &mut RemovalNotices, id: u64, outcome: Outcome) {
    match outcome {
        Outcome::Done => notices.done(id),
        Outcome::Failed(e) => {
            // The first failure is worth a line; a node that stays down is not.
            if notices.failed(id, Instant::now()) == 1 {
                tracing::info!(id, "could not tell node it was removed (will retry): {e}");
            } else {
                tracing::debug!(id, "could not tell node it was removed: {e}");
            }
        }
    }
}

/// Whether the node leads, and its committed membership (id to address).
fn observe(
    m: &openraft::metrics::RaftServerMetrics<meta_consensus::TypeConfig>,
) -> (bool, BTreeMap<u64, String>) {
    let members = m
        .committed_membership_config
        .membership()
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect();
    (m.state == ServerState::Leader, members)
}

enum Outcome {
    Done,
    Failed(String),
}

/// One attempt to tell node `id` at `addr` that it was removed.
async fn tell(state: AppState, id: u64, addr: String) -> (u64, Outcome) {
    // The node's own committed membership decides: a notice is only ever given for one that
    // leaves the node out (a newer one may name it again before this follower of the metrics
    // sees it).
    let Some(removal) = state.node.removal_for(id) else {
        return (id, Outcome::Done);
    };
    let Some(request) = state.member_link().post(id, &addr, PATH_REMOVED) else {
        let why = "this node knows no cluster id yet";
        return (id, Outcome::Failed(why.into()));
    };
    // Only for the member itself: a process there that holds no cluster's data (a new node
    // with that id, or one whose data dir was wiped) refuses it, rather than taking this
    // cluster's id from it and calling itself removed.
    let request = request.header(MEMBER_ONLY, "1").body(removal.encode());
    let outcome = match request.send().await {
        Ok(r) if r.status().is_success() => {
            tracing::info!(id, "told node it was removed");
            Outcome::Done
        }
        // Refused for good: a malformed notice, a build without the route, another node or
        // one of no cluster. Anything else (a timeout, an overloaded node, a token being
        // rotated) may pass.
        Ok(r) if matches!(r.status().as_u16(), 400 | 404 | 409) => {
            tracing::info!(id, status = %r.status(), "node refused its removal notice");
            Outcome::Done
        }
        Ok(r) => Outcome::Failed(format!("answered {}", r.status())),
        Err(e) => Outcome::Failed(e.to_string()),
    };
    (id, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[u64]) -> BTreeMap<u64, String> {
        ids.iter().map(|id| (*id, format!("n{id}:1"))).collect()
    }

    fn ids(due: Vec<(u64, String)>) -> Vec<u64> {
        due.into_iter().map(|(id, _)| id).collect()
    }

    #[test]
    fn a_removed_node_is_due_at_once_and_a_readded_one_is_not() {
        let now = Instant::now();
        let mut notices = RemovalNotices::new(members(&[1, 2, 3, 4]));
        assert!(notices.take_due(now).is_empty());
        notices.saw(members(&[1, 2, 3]), now);
        assert_eq!(notices.take_due(now), vec![(4, "n4:1".to_string())]);
        // Added back while the attempt ran: nothing to tell, and its outcome changes nothing.
        notices.saw(members(&[1, 2, 3, 4]), now);
        assert!(notices.is_empty());
        assert_eq!(notices.failed(4, now), 0);
        assert!(notices.is_empty());
        // Two changes seen as one: only what the last leaves out counts.
        notices.saw(members(&[1, 2, 5]), now);
        assert_eq!(ids(notices.take_due(now)), vec![3, 4]);
    }

    #[test]
    fn a_restored_list_is_due_at_once_but_not_for_members() {
        let now = Instant::now();
        let mut notices = RemovalNotices::new(members(&[1, 2, 3]));
        let version = notices.version();
        // Node 3 was removed once and added again since the list was kept.
        notices.restore(members(&[3, 4]), now);
        assert_ne!(notices.version(), version);
        assert_eq!(notices.untold(), members(&[4]));
        assert_eq!(notices.next_attempt(), Some(now));
        assert_eq!(ids(notices.take_due(now)), vec![4]);
        notices.failed(4, now);
        notices.restore(members(&[4]), now);
        assert_eq!(
            notices.next_attempt(),
            Some(now + FIRST_RETRY),
            "kept its pause"
        );
    }

    #[test]
    fn the_version_changes_exactly_when_the_untold_nodes_do() {
        let now = Instant::now();
        let mut notices = RemovalNotices::new(members(&[1, 2, 3]));
        let mut last = notices.version();
        let mut changed = |notices: &RemovalNotices| {
            let v = notices.version();
            std::mem::replace(&mut last, v) != v
        };
        notices.saw(members(&[1, 2, 3]), now);
        assert!(!changed(&notices));
        notices.saw(members(&[1, 2]), now);
        assert!(changed(&notices), "3 removed");
        notices.take_due(now);
        notices.failed(3, now);
        assert!(!changed(&notices), "a failure changes only when");
        notices.saw(members(&[1, 2, 3]), now);
        assert!(changed(&notices), "3 added again");
        notices.saw(members(&[1]), now);
        assert!(changed(&notices));
        notices.done(2);
        assert!(changed(&notices));
        notices.done(2);
        assert!(!changed(&notices), "already done");
        notices.restore(members(&[3]), now);
        assert!(!changed(&notices), "already untold");
    }

    #[test]
    fn an_uninitialized_membership_removes_nobody() {
        let now = Instant::now();
        let mut notices = RemovalNotices::new(members(&[1, 2]));
        notices.saw(BTreeMap::new(), now);
        assert!(notices.is_empty());
        notices.saw(members(&[1, 2]), now);
        assert!(notices.is_empty());
    }

    #[test]
    fn a_node_is_not_due_again_while_an_attempt_to_tell_it_runs() {
        let now = Instant::now();
        let mut notices = RemovalNotices::new(members(&[1, 2, 3]));
        notices.saw(members(&[1]), now);
        assert_eq!(ids(notices.take_due(now)), vec![2, 3]);
        let later = now + MAX_RETRY * 10;
        assert!(notices.take_due(later).is_empty());
        assert_eq!(notices.next_attempt(), None);
        // One attempt fails: that node alone is due again, after its pause.
        notices.failed(2, now);
        assert_eq!(notices.next_attempt(), Some(now + FIRST_RETRY));
        assert!(notices.take_due(now).is_empty());
        assert_eq!(ids(notices.take_due(now + FIRST_RETRY)), vec![2]);
        notices.done(3);
        notices.done(2);
        assert!(notices.is_empty());
    }

    #[test]
    fn failures_back_off_up_to_the_cap_and_done_ends_the_attempts() {
        let start = Instant::now();
        let mut notices = RemovalNotices::new(members(&[1, 2]));
        notices.saw(members(&[1]), start);
        assert_eq!(notices.next_attempt(), Some(start));
        let mut pauses = Vec::new();
        let mut now = start;
        for _ in 0..10 {
            assert_eq!(notices.take_due(now).len(), 1);
            notices.failed(2, now);
            let next = notices.next_attempt().unwrap();
            assert!(notices.take_due(now).is_empty());
            pauses.push(next - now);
            now = next;
        }
        assert_eq!(pauses[0], FIRST_RETRY);
        assert_eq!(pauses[1], FIRST_RETRY * 2);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), MAX_RETRY);
        notices.done(2);
        assert_eq!(notices.next_attempt(), None);
        // A failure reported for a node no longer to be told changes nothing.
        assert_eq!(notices.failed(2, now), 0);
        assert!(notices.is_empty());
    }
}
