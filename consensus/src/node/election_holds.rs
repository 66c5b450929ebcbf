//! Why a node may not stand for election now. openraft has one switch for elections
//! (`RuntimeConfigHandle::elect`); several rules turn it off for their own reasons and end at
//! their own times, so each sets its hold here and the switch is on only while none holds.

use super::MetaNode;

/// The reasons that keep this node from starting elections; it may start them once none holds.
/// Turning elections off does not change how the node answers: it still follows a leader that
/// reaches it, and votes by its own rules (`votes.rs`).
#[derive(Debug, Default)]
pub(super) struct ElectionHolds {
    /// The node stops ([`MetaNode::stop_elections`]); nothing ends this hold.
    pub stopped: bool,
    /// A lease this node may have given before it opened could still run (`votes.rs`).
    pub lease: bool,
    /// The node started with no Raft state and holds part of the cluster's log but not yet
    /// every entry its former self may have helped commit (`rejoin_marker.rs`).
    pub rejoin: bool,
}

impl ElectionHolds {
    /// Whether the node may start elections.
    pub fn may_elect(&self) -> bool {
        !(self.stopped || self.lease || self.rejoin)
    }
}

impl MetaNode {
    /// Changes the holds with `change`, then sets openraft's switch to match, under one lock:
    /// two rules that change their holds at once cannot leave the switch as only one saw it.
    pub(super) fn set_election_holds(&self, change: impl FnOnce(&mut ElectionHolds)) {
        let mut holds = self.inner.election_holds.lock();
        change(&mut holds);
        self.inner.raft.runtime_config().elect(holds.may_elect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elections_are_on_only_while_nothing_holds_them() {
        let mut h = ElectionHolds::default();
        assert!(h.may_elect());
        h.lease = true;
        h.rejoin = true;
        assert!(!h.may_elect());
        h.lease = false;
        assert!(!h.may_elect(), "the rejoin still holds");
        h.rejoin = false;
        assert!(h.may_elect());
        h.stopped = true;
        assert!(!h.may_elect());
    }
}
