//! How a rejoining node learns the cluster's term before it acknowledges any leader: it asks
//! the members for their term and membership through the transport (this trait), and decides
//! whether it heard from enough of them ([`heard_enough`]).
//!
//! Why: a voter that lost its data dir may have voted, before it lost it, for the leader of a
//! newer term than a deposed leader (cut off, unaware) that reaches it first. Its
//! acknowledgement could let that deposed leader commit entries that conflict with the newer
//! term's. Raft rules this out because some member of every quorum that elected the newer
//! leader refuses the older term; the node that lost its data dir no longer can. So it asks the
//! others: any member of that quorum other than itself answers with a term at least as new,
//! and the node then refuses every leader of an older term (`node/rejoin_gate.rs`).

use std::collections::{BTreeMap, BTreeSet};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::types::NodeId;

/// A member's answer: its current term and its membership.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermAnswer {
    /// The term of the member's vote.
    pub term: u64,
    /// The voter sets of its membership: one, or two during a joint change.
    pub voters: Vec<BTreeSet<NodeId>>,
    /// Every member's address, learners included.
    pub addrs: BTreeMap<NodeId, String>,
}

/// Asks another member for its [`TermAnswer`]. Each transport implements it.
pub trait TermProbe: Send + Sync + 'static {
    /// Asks member `id`, at `addr` when this node knows it (the in-process transport needs
    /// none). `Err` says why no answer came. The caller bounds how long it waits.
    fn ask(
        &self,
        id: NodeId,
        addr: Option<String>,
    ) -> BoxFuture<'static, Result<TermAnswer, String>>;
}

/// A network factory that can also ask members for their term (`MetaNode::open` takes it).
pub trait ProbeMembers {
    /// A prober that sends from this node.
    fn term_probe(&self) -> std::sync::Arc<dyn TermProbe>;
}

/// Whether node `me` heard from enough other voters to know the cluster's newest term: in
/// each voter set that holds it, every quorum that holds it must hold another voter it heard
/// from. With `n` voters and quorum `q`, that is `n - q + 1` of the others (all of them in a
/// set of three, three of four others in a set of five). A set that does not hold `me` needs
/// nothing: its quorums never count this node. A set of `me` alone can never be covered.
pub(crate) fn heard_enough(
    me: NodeId,
    voters: &[BTreeSet<NodeId>],
    heard: &BTreeSet<NodeId>,
) -> bool {
    voters.iter().filter(|set| set.contains(&me)).all(|set| {
        let n = set.len();
        let quorum = n / 2 + 1;
        let others = set
            .iter()
            .filter(|v| **v != me && heard.contains(v))
            .count();
        others > n - quorum
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn three_voters_need_both_others() {
        let voters = [set(&[1, 2, 3])];
        assert!(!heard_enough(3, &voters, &set(&[1])));
        assert!(!heard_enough(3, &voters, &set(&[2])));
        assert!(heard_enough(3, &voters, &set(&[1, 2])));
    }

    #[test]
    fn five_voters_need_three_of_the_four_others() {
        let voters = [set(&[1, 2, 3, 4, 5])];
        assert!(!heard_enough(5, &voters, &set(&[1, 2])));
        assert!(heard_enough(5, &voters, &set(&[1, 2, 3])));
        // What it heard of itself does not count.
        assert!(!heard_enough(5, &voters, &set(&[1, 2, 5])));
    }

    #[test]
    fn a_learner_needs_no_one_and_a_lone_voter_can_never_be_covered() {
        assert!(heard_enough(4, &[set(&[1, 2, 3])], &set(&[])));
        assert!(!heard_enough(1, &[set(&[1])], &set(&[2, 3])));
        assert!(heard_enough(2, &[set(&[1, 2])], &set(&[1])));
    }

    #[test]
    fn a_joint_membership_needs_each_set_that_holds_the_node() {
        let voters = [set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!heard_enough(3, &voters, &set(&[1, 2])));
        assert!(!heard_enough(3, &voters, &set(&[4, 5])));
        assert!(heard_enough(3, &voters, &set(&[1, 2, 4, 5])));
        assert!(heard_enough(1, &voters, &set(&[2, 3])));
    }
}
