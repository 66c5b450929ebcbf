//! Which other voters are short of disk, as the leader last learned it: from its disk look (it
//! asks every voter every few seconds, and when it takes office) and from the voters' own
//! alarms (a voter that finds itself short of disk tells its leader at once, and that it has
//! room again once it has). The newer word about a voter wins: a look whose asks began before
//! a voter's alarm does not undo the alarm.
//!
//! Plain bookkeeping: the caller gives the times, tests drive it without a runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::types::NodeId;

/// The other voters short of disk, and the alarms newer than the last look.
#[derive(Debug, Default)]
pub struct VoterRooms {
    short: BTreeSet<NodeId>,
    /// Voter to when it sent its alarm and whether it said it was short.
    alarms: BTreeMap<NodeId, (Instant, bool)>,
}

impl VoterRooms {
    /// A look whose asks began at `asked_at` found the voters `short` short of disk, and the
    /// others it asked with room (or silent). A voter's alarm received after `asked_at` stands.
    pub fn looked(&mut self, short: BTreeSet<NodeId>, asked_at: Instant) {
        self.alarms.retain(|_, (at, _)| *at > asked_at);
        self.short = short;
        for (id, (_, short)) in &self.alarms {
            if *short {
                self.short.insert(*id);
            } else {
                self.short.remove(id);
            }
        }
    }

    /// Voter `id` said at `at` that it is `short` of disk (or has room again). Returns whether
    /// that changed what this leader knew of it.
    pub fn alarmed(&mut self, id: NodeId, short: bool, at: Instant) -> bool {
        self.alarms.insert(id, (at, short));
        if short {
            self.short.insert(id)
        } else {
            self.short.remove(&id)
        }
    }

    /// The other voters short of disk.
    pub fn short(&self) -> &BTreeSet<NodeId> {
        &self.short
    }

    /// Forgets everything (this node no longer leads).
    pub fn clear(&mut self) {
        *self = VoterRooms::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn an_alarm_counts_at_once_and_a_look_begun_before_it_does_not_undo_it() {
        let t0 = Instant::now();
        let mut rooms = VoterRooms::default();
        rooms.looked(set(&[]), t0);
        assert!(rooms.alarmed(2, true, t0 + Duration::from_millis(10)));
        assert!(!rooms.alarmed(2, true, t0 + Duration::from_millis(20)));
        assert_eq!(rooms.short(), &set(&[2]));
        // A look that began asking before the alarm found 2 with room: the alarm is newer.
        rooms.looked(set(&[3]), t0 + Duration::from_millis(5));
        assert_eq!(rooms.short(), &set(&[2, 3]));
        // One that began after it decides.
        rooms.looked(set(&[3]), t0 + Duration::from_millis(30));
        assert_eq!(rooms.short(), &set(&[3]));
    }

    #[test]
    fn a_voter_with_room_again_is_dropped_at_once_and_clear_forgets_all() {
        let t0 = Instant::now();
        let mut rooms = VoterRooms::default();
        rooms.looked(set(&[2, 3]), t0);
        assert!(rooms.alarmed(3, false, t0 + Duration::from_millis(1)));
        assert!(!rooms.alarmed(3, false, t0 + Duration::from_millis(2)));
        assert_eq!(rooms.short(), &set(&[2]));
        // An older look's answer that 3 was short does not bring it back.
        rooms.looked(set(&[2, 3]), t0);
        assert_eq!(rooms.short(), &set(&[2]));
        rooms.clear();
        assert!(rooms.short().is_empty());
        rooms.looked(set(&[3]), t0);
        assert_eq!(rooms.short(), &set(&[3]), "the cleared alarm is gone");
    }
}
