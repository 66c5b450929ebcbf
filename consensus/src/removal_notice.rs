//! A member's word that this node was removed from the cluster. A voter removed while it was a
//! follower usually never learns of it: the leader stops replicating to it once the membership
//! without it is appended, so its own log still names it, and it campaigns in vain. The
//! members it asks for votes know better: a member whose committed membership names neither
//! the candidate as voter nor as learner, and whose membership entry the candidate's log lacks,
//! answers the vote request with a notice (see `node/votes.rs`), which the transport hands to
//! the candidate's [`RemovalNotice`].
//!
//! Contracts: a notice is only ever given for a committed membership, so it is never wrong
//! when given; it stops applying once this node's own membership is at least as new (the node
//! was added again, or learned of its removal itself).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::types::NodeId;

/// The newest removal notice a node received, shared between the node and its transport.
#[derive(Clone, Debug, Default)]
pub struct RemovalNotice(Arc<Mutex<Option<Removal>>>);

/// What a member said: the log index of its committed membership, which leaves this node out,
/// and the members it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub membership_index: u64,
    pub members: Vec<NodeId>,
}

impl Removal {
    /// The form carried in a header: `INDEX;ID,ID,..`.
    pub fn encode(&self) -> String {
        let members: Vec<String> = self.members.iter().map(|m| m.to_string()).collect();
        format!("{};{}", self.membership_index, members.join(","))
    }

    /// Parses [`Removal::encode`]'s form; `None` if it is not that, or names an index past
    /// any log (such a notice would apply until this node's log reached it: for ever).
    pub fn decode(text: &str) -> Option<Removal> {
        let (index, members) = text.split_once(';')?;
        let members = if members.is_empty() {
            Vec::new()
        } else {
            members
                .split(',')
                .map(|m| m.parse().ok())
                .collect::<Option<Vec<NodeId>>>()?
        };
        let membership_index = index
            .parse()
            .ok()
            .filter(|i| *i <= crate::rpc_bounds::MAX_INDEX)?;
        Some(Removal {
            membership_index,
            members,
        })
    }
}

impl RemovalNotice {
    /// Records `removal` unless a notice of a newer membership is recorded already.
    pub fn note(&self, removal: Removal) {
        let mut current = self.0.lock();
        let newer = current
            .as_ref()
            .is_none_or(|c| c.membership_index < removal.membership_index);
        if newer {
            tracing::warn!(
                members = ?removal.members,
                membership_index = removal.membership_index,
                "a member says this node was removed from the cluster: stop it, or add it again \
                 as a learner"
            );
            *current = Some(removal);
        }
    }

    /// The notice that applies to a node whose own membership entry is at `own_index`: one
    /// about a newer membership.
    pub fn applying_to(&self, own_index: Option<u64>) -> Option<Removal> {
        self.0
            .lock()
            .as_ref()
            .filter(|r| own_index.is_none_or(|own| r.membership_index > own))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removal(index: u64, members: &[NodeId]) -> Removal {
        Removal {
            membership_index: index,
            members: members.to_vec(),
        }
    }

    #[test]
    fn encodes_and_decodes() {
        for r in [
            removal(7, &[1, 3]),
            removal(0, &[]),
            removal(crate::rpc_bounds::MAX_INDEX, &[2]),
        ] {
            assert_eq!(Removal::decode(&r.encode()), Some(r));
        }
        let past = removal(crate::rpc_bounds::MAX_INDEX + 1, &[2]).encode();
        for bad in ["", "7", "x;1", "7;1,,2", "7;a", "-1;2", past.as_str()] {
            assert_eq!(Removal::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn keeps_the_newest_and_applies_to_older_memberships_only() {
        let notice = RemovalNotice::default();
        assert_eq!(notice.applying_to(Some(5)), None);
        notice.note(removal(10, &[1, 3]));
        notice.note(removal(8, &[1, 2, 3]));
        assert_eq!(notice.applying_to(Some(5)), Some(removal(10, &[1, 3])));
        assert_eq!(notice.applying_to(None), Some(removal(10, &[1, 3])));
        // Added again (or told by its own log): a membership at least as new.
        assert_eq!(notice.applying_to(Some(10)), None);
        assert_eq!(notice.applying_to(Some(12)), None);
    }
}
