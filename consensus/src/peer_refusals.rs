//! The members that refuse this node's messages as another cluster's. A node whose data dir
//! was wiped and that was then started with `--init` by mistake forms a cluster of its own,
//! under a fresh id, with its former peers as voters: they refuse every message it sends
//! (`cluster_id.rs`), so it can never be elected, and its clients would wait for a leader
//! until their requests time out. The transport notes each member's answer here; the node
//! reads which members refused lately, says so in its status, and once too few voters are
//! left to elect a leader, refuses its clients at once with the reason
//! ([`crate::Error::RefusedByMembers`]) so that they try another member.
//!
//! A leader sees the same from its side: the wiped member refuses its heartbeats, and the
//! leader's status names it.
//!
//! Members that refuse this node's token (401: one side was started with another `--token`)
//! are noted apart: each side's status names the other, and a member whose leader refuses its
//! token says so when it answers that its leader is silent. Such a member holds this
//! cluster's state, so it is not refused the way another cluster's member is.
//!
//! Members whose address nothing listens at (a connection refused or not made) are noted too,
//! until they answer: a leader that stops does not hand its office to a voter that stopped
//! with it (a whole cluster stopped at once), nor waits for one.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::types::NodeId;

/// How long a member's refusal counts when no later message repeated it: longer than the
/// pause between a leader's attempts to reach such a member (`meta-http`'s `network.rs`) and
/// than a candidate's election timeout.
pub const RECENT: Duration = Duration::from_secs(30);

/// Member id to when it last refused a message of this node, as another cluster's or for its
/// token; cleared by its next answer that takes one. Shared by the node and its transport.
#[derive(Clone, Debug, Default)]
pub struct PeerRefusals(Arc<Mutex<Refusals>>);

#[derive(Debug, Default)]
struct Refusals {
    other_cluster: HashMap<NodeId, Instant>,
    token: HashMap<NodeId, Instant>,
    not_connected: HashMap<NodeId, Instant>,
    /// Members that refused this leader's last snapshot for want of room, with their words.
    snapshot_room: HashMap<NodeId, (Instant, String)>,
}

impl PeerRefusals {
    /// Member `id` refused a message of this node: it belongs to another cluster.
    pub fn refused(&self, id: NodeId) {
        self.0.lock().other_cluster.insert(id, Instant::now());
    }

    /// Member `id` refused a message of this node's for its token (401).
    pub fn token_refused(&self, id: NodeId) {
        self.0.lock().token.insert(id, Instant::now());
    }

    /// Member `id` took a message of this node (it answered as a member of its cluster).
    pub fn accepted(&self, id: NodeId) {
        let mut refusals = self.0.lock();
        refusals.other_cluster.remove(&id);
        refusals.token.remove(&id);
        refusals.not_connected.remove(&id);
    }

    /// Member `id` answered a message of this node, whatever it answered.
    pub fn answered(&self, id: NodeId) {
        self.0.lock().not_connected.remove(&id);
    }

    /// A message to member `id` finds nothing listening at its address: the connection was
    /// refused or could not be made (it stopped, or its host is down).
    pub fn not_connecting(&self, id: NodeId) {
        self.0.lock().not_connected.insert(id, Instant::now());
    }

    /// The members whose address the last message found nothing listening at, and that have
    /// not answered since.
    pub fn not_connected(&self) -> BTreeSet<NodeId> {
        self.0.lock().not_connected.keys().copied().collect()
    }

    /// When a message to member `id` last found nothing listening, if it has not answered
    /// since.
    pub fn not_connected_at(&self, id: NodeId) -> Option<Instant> {
        self.0.lock().not_connected.get(&id).copied()
    }

    /// Member `id` answered this leader's snapshot: refused it for want of room, saying `why`
    /// (`Some`), or took it or refused it for another reason (`None`).
    pub fn snapshot_answered(&self, id: NodeId, why: Option<String>) {
        let mut refusals = self.0.lock();
        match why {
            Some(why) => refusals.snapshot_room.insert(id, (Instant::now(), why)),
            None => refusals.snapshot_room.remove(&id),
        };
    }

    /// Why member `id` refused this leader's last snapshot for want of room, if it did within
    /// `recent`: it cannot catch up until it has room.
    pub fn snapshot_refusal(&self, id: NodeId, recent: Duration) -> Option<String> {
        let refusals = self.0.lock();
        let (at, why) = refusals.snapshot_room.get(&id)?;
        (at.elapsed() < recent).then(|| why.clone())
    }

    /// Whether any member's last answer refused this node's message as another cluster's
    /// (however long ago).
    pub fn any(&self) -> bool {
        !self.0.lock().other_cluster.is_empty()
    }

    /// How long to wait before sending member `id` another message, for it to be sent at
    /// most every `pause` while the member's last answer refused one as another cluster's:
    /// such a member refuses every message until it is wiped and rejoins, and each refusal
    /// costs both sides a connection and a warning. `None`: send at once.
    pub fn wait_before_asking(&self, id: NodeId, pause: Duration) -> Option<Duration> {
        let at = *self.0.lock().other_cluster.get(&id)?;
        Some(pause.saturating_sub(at.elapsed())).filter(|wait| !wait.is_zero())
    }

    /// The members whose last answer, within `recent`, refused this node's message as another
    /// cluster's.
    pub fn within(&self, recent: Duration) -> BTreeSet<NodeId> {
        lately(&self.0.lock().other_cluster, recent)
    }

    /// The members whose last answer, within `recent`, refused this node's token.
    pub fn token_within(&self, recent: Duration) -> BTreeSet<NodeId> {
        lately(&self.0.lock().token, recent)
    }
}

/// The members of `refused` that refused within `recent`.
fn lately(refused: &HashMap<NodeId, Instant>, recent: Duration) -> BTreeSet<NodeId> {
    refused
        .iter()
        .filter(|(_, at)| at.elapsed() < recent)
        .map(|(id, _)| *id)
        .collect()
}

/// Whether voters `voters` can elect no leader while `refusing` refuse every message: the
/// others, this node among them, are fewer than a majority.
pub(crate) fn no_quorum_left(voters: &BTreeSet<NodeId>, refusing: &BTreeSet<NodeId>) -> bool {
    let left = voters.difference(refusing).count();
    !voters.is_empty() && left < voters.len() / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counts_until_the_member_takes_a_message_or_it_is_old() {
        let refusals = PeerRefusals::default();
        refusals.refused(2);
        refusals.refused(3);
        let recent = Duration::from_secs(60);
        assert_eq!(refusals.within(recent), BTreeSet::from([2, 3]));
        refusals.accepted(2);
        assert_eq!(refusals.within(recent), BTreeSet::from([3]));
        assert_eq!(refusals.within(Duration::ZERO), BTreeSet::new(), "too old");
    }

    #[test]
    fn a_refused_token_is_noted_apart_until_the_member_takes_a_message() {
        let refusals = PeerRefusals::default();
        refusals.token_refused(2);
        refusals.refused(3);
        let recent = Duration::from_secs(60);
        assert_eq!(refusals.token_within(recent), BTreeSet::from([2]));
        assert_eq!(refusals.within(recent), BTreeSet::from([3]));
        assert_eq!(refusals.wait_before_asking(2, recent), None, "not paused");
        refusals.accepted(2);
        assert_eq!(refusals.token_within(recent), BTreeSet::new());
        refusals.token_refused(3);
        assert_eq!(
            refusals.token_within(Duration::ZERO),
            BTreeSet::new(),
            "too old"
        );
    }

    #[test]
    fn a_member_not_connected_counts_until_it_answers() {
        let refusals = PeerRefusals::default();
        let before = Instant::now();
        refusals.not_connecting(2);
        refusals.not_connecting(3);
        assert_eq!(refusals.not_connected(), BTreeSet::from([2, 3]));
        assert!(refusals.not_connected_at(2).is_some_and(|at| at >= before));
        refusals.answered(2);
        refusals.accepted(3);
        assert_eq!(refusals.not_connected_at(2), None);
        assert_eq!(refusals.not_connected_at(3), None);
        assert_eq!(refusals.not_connected_at(4), None);
    }

    #[test]
    fn a_refusing_member_is_asked_at_most_every_pause() {
        let refusals = PeerRefusals::default();
        let pause = Duration::from_secs(60);
        assert_eq!(refusals.wait_before_asking(2, pause), None, "never refused");
        refusals.refused(2);
        let wait = refusals
            .wait_before_asking(2, pause)
            .expect("refused just now");
        assert!(wait > Duration::from_secs(50) && wait <= pause, "{wait:?}");
        assert_eq!(
            refusals.wait_before_asking(2, Duration::ZERO),
            None,
            "paused enough"
        );
        refusals.accepted(2);
        assert_eq!(
            refusals.wait_before_asking(2, pause),
            None,
            "took one since"
        );
    }

    #[test]
    fn a_majority_of_voters_refusing_leaves_no_quorum() {
        let three = BTreeSet::from([1, 2, 3]);
        assert!(!no_quorum_left(&three, &BTreeSet::new()));
        assert!(
            !no_quorum_left(&three, &BTreeSet::from([2])),
            "1 and 3 elect"
        );
        assert!(no_quorum_left(&three, &BTreeSet::from([2, 3])));
        let five = BTreeSet::from([1, 2, 3, 4, 5]);
        assert!(!no_quorum_left(&five, &BTreeSet::from([4, 5])));
        assert!(no_quorum_left(&five, &BTreeSet::from([3, 4, 5])));
        let refusing_learner = BTreeSet::from([9]);
        assert!(!no_quorum_left(&three, &refusing_learner), "not a voter");
        assert!(
            !no_quorum_left(&BTreeSet::new(), &refusing_learner),
            "no cluster"
        );
    }
}
