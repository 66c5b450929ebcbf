//! Which log commands every member of the cluster can apply.
//!
//! A command added after a cluster first ran (`PruneReplicas`) must never reach a member whose
//! build cannot decode it: that member would stop at the entry, and stop again at every restart
//! (it replays the entry). So every build has a version (the commands it applies, and the
//! formats it reads), every member answers Raft messages with its build's version, and the
//! cluster's version is a committed fact: the leader raises it (`Command::SetClusterVersion`)
//! only once every member answered recently with at least that version, and proposes a command
//! that needs a version only once the cluster has it. A cluster's version never falls: a member
//! whose build is older refuses to start, and a learner whose build is older, or unknown (it
//! has not answered), is not added once the version is past [`BASE_VERSION`].
//!
//! The leader raises the version when a command first needs it, not at once: a cluster whose
//! members were all upgraded keeps the older version (and its members may still be swapped for
//! older builds) until the first such command. A datanode's removal also raises it, to 7, else 4,
//! else 3, as far as every member allows it at once (`node/removal.rs`): it goes in pieces from then
//! on, and goes as one entry, without waiting, while a member does not allow 3.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::EntryPayload;
use parking_lot::Mutex;

use crate::command::Command;
use crate::types::{Entry, NodeId};

/// The version of this build. 2: `PruneReplicas` and `SetClusterVersion`. 3:
/// `RemoveDatanodePiece`, and epoch floors kept for removed datanodes. 4: `RaiseEpochFloor`,
/// the cluster's epoch floor, and a removal's first piece fences the incarnation it removes.
/// 5: `DeregisterShardsOf`, a deregistration fenced by the datanode's epoch. 6:
/// `ClaimForRestore`, a restore's claim on a fresh cluster. 7: a removal's first piece marks
/// the datanode as being removed, fencing the epoch it raised it to as well. 8: `BeginRestore`
/// and `EndRestore`, a restore's mark on the cluster while it runs. 9:
/// `BeginRestoreHoldingKeys` and `RestorePut`, a restore during which only its own key writes
/// go on.
pub const BUILD_VERSION: u32 = 9;

/// The version from which a removal goes in pieces (`RemoveDatanodePiece`) and a removed
/// datanode's epoch is kept as the floor of its id's next registration.
pub const PIECEWISE_REMOVAL: u32 = 3;

/// The version from which the cluster keeps an epoch floor (`RaiseEpochFloor`) that every
/// registration's epoch is at least.
pub const CLUSTER_EPOCH_FLOOR: u32 = 4;

/// The version from which a removal's first piece fences the incarnation it removes (its
/// epoch goes up by one), so that the datanode's batches cannot keep a removal going.
pub const FENCING_REMOVAL: u32 = 4;

/// The version from which a datanode's deregistration can name its incarnation
/// (`DeregisterShardsOf`): a former incarnation's late deregistration is fenced rather than
/// drop a replica the current one registered.
pub const FENCED_DEREGISTRATION: u32 = 5;

/// The version from which a restore claims the cluster it goes into (`ClaimForRestore`): of
/// two restores run into one cluster at once, one is refused before it writes anything.
pub const RESTORE_CLAIM: u32 = 6;

/// The version from which a removal's first piece also marks the datanode as being removed:
/// it keeps the epoch it raised the datanode to under the id's epoch floor key while the
/// record stays, and a batch, prune, heartbeat or deregistration under that epoch (which no
/// registration gave) is fenced too, until the removal ends or the datanode registers again.
pub const REMOVAL_MARK: u32 = 7;

/// The version from which a restore's claim also marks the cluster as being restored
/// (`BeginRestore`), until the restore ends (`EndRestore`): a cluster that holds part of a
/// backup says so, and a snapshot of it carries the mark.
pub const RESTORE_MARK: u32 = 8;

/// The version from which a restore's claim can hold keys back (`BeginRestoreHoldingKeys`):
/// until the restore ends, every key write (`Put`, `Delete`) is refused but the restore's own
/// (`RestorePut`), since a key a client overwrote while a restore ran would keep the restore's
/// counts and go unseen. A restore begun by an older build's claim (`BeginRestore`) holds no key
/// back: its writes are plain ones.
pub const RESTORE_KEYS: u32 = 9;

/// The version of a build that names none (it predates versions), and a cluster's version
/// until it is first raised: the commands up to `RegisterDatanodeAtLeast`.
pub const BASE_VERSION: u32 = 1;

/// The versions members' builds answered with, and when: filled by the transport from the
/// answers to this node's Raft messages (the leader sends to every member several times a
/// second), read by the leader before it raises the cluster's version.
#[derive(Clone, Debug, Default)]
pub struct PeerVersions(Arc<Mutex<HashMap<NodeId, (u32, Instant)>>>);

impl PeerVersions {
    /// Member `id` answered a message as a build of `version`.
    pub fn note(&self, id: NodeId, version: u32) {
        self.0.lock().insert(id, (version, Instant::now()));
    }

    /// A message to member `id` failed: what it answered before counts no more, so a member
    /// restarted (perhaps as another build) counts only once it answers again.
    pub fn forget(&self, id: NodeId) {
        self.0.lock().remove(&id);
    }

    /// The version member `id` answered with last, if that was within `recent`.
    pub fn heard_within(&self, id: NodeId, recent: Duration) -> Option<u32> {
        let (version, at) = *self.0.lock().get(&id)?;
        (at.elapsed() < recent).then_some(version)
    }
}

/// A member that keeps the cluster below a version: the version its build answered with
/// recently, or `None` when it did not answer recently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Behind {
    pub node: NodeId,
    pub version: Option<u32>,
}

/// What the leader raises the cluster's version to, for a command that needs `needed`: exactly
/// `needed` (no further than asked, so builds of that version can still be put back), if every
/// member answered (`heard` gives each one's recent answer) as a build of at least that;
/// otherwise the members that keep it below.
pub fn raisable(
    members: impl IntoIterator<Item = NodeId>,
    needed: u32,
    heard: impl Fn(NodeId) -> Option<u32>,
) -> Result<u32, Vec<Behind>> {
    let mut behind = Vec::new();
    for node in members {
        let version = heard(node);
        if version.is_none_or(|v| v < needed) {
            behind.push(Behind { node, version });
        }
    }
    if behind.is_empty() {
        Ok(needed)
    } else {
        Err(behind)
    }
}

/// Cuts `entries`, the entries of one append message, after the first that raises the cluster's
/// version, and returns the entries that followed it, if any did. The leader's transport sends
/// them in a message of their own, right after.
///
/// A member swapped for an older build after its last answer and before a raise (see the module
/// comment) decodes a message whole: one that carries the raise and, after it, a command of the
/// new version (the command that needed the raise) was refused as undecodable, again and again,
/// so the member never appended the raise, at which it would stop, saying why. It answered the
/// leader's heartbeats all the while, and looked alive. Ending a message at the raise lets it
/// append the raise, learn that the raise committed, and stop at it. Raises are rare: the cut
/// costs a message a few times in a cluster's life.
pub fn split_after_version_raise(entries: &mut Vec<Entry>) -> Option<Vec<Entry>> {
    let raise = entries.iter().position(|e| {
        matches!(
            e.payload,
            EntryPayload::Normal(Command::SetClusterVersion { .. })
        )
    })?;
    (raise + 1 < entries.len()).then(|| entries.split_off(raise + 1))
}

/// The message for a command refused because of `behind`.
pub(crate) fn describe_behind(behind: &[Behind]) -> String {
    behind
        .iter()
        .map(|b| match b.version {
            Some(v) => format!("node {} runs a build of version {v}", b.node),
            None => format!("node {} has not answered", b.node),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_rises_as_far_as_asked_only_when_all_members_have_the_version() {
        let heard = |versions: &'static [(NodeId, Option<u32>)]| {
            move |id: NodeId| {
                versions
                    .iter()
                    .find(|(n, _)| *n == id)
                    .and_then(|(_, v)| *v)
            }
        };
        assert_eq!(
            raisable(
                [1, 2, 3],
                2,
                heard(&[(1, Some(3)), (2, Some(2)), (3, Some(4))])
            ),
            Ok(2)
        );
        assert_eq!(
            raisable([1, 2], 2, heard(&[(1, Some(3)), (2, Some(3))])),
            Ok(2)
        );
        assert_eq!(
            raisable(
                [1, 2, 3],
                2,
                heard(&[(1, Some(2)), (2, Some(1)), (3, None)])
            ),
            Err(vec![
                Behind {
                    node: 2,
                    version: Some(1)
                },
                Behind {
                    node: 3,
                    version: None
                },
            ])
        );
        // A member that never answered counts as behind, not as absent.
        assert!(raisable([1, 4], 2, heard(&[(1, Some(2))])).is_err());
    }

    #[test]
    fn an_old_answer_does_not_count() {
        let versions = PeerVersions::default();
        assert_eq!(versions.heard_within(1, Duration::from_secs(60)), None);
        versions.note(1, 2);
        assert_eq!(versions.heard_within(1, Duration::from_secs(60)), Some(2));
        assert_eq!(versions.heard_within(1, Duration::ZERO), None);
        versions.note(1, 1);
        assert_eq!(versions.heard_within(1, Duration::from_secs(60)), Some(1));
        versions.forget(1);
        assert_eq!(versions.heard_within(1, Duration::from_secs(60)), None);
    }

    #[test]
    fn an_append_message_ends_at_its_first_version_raise() {
        let entry = |index: u64, cmd: Command| Entry {
            log_id: crate::types::LogId::new(
                openraft::vote::leader_id_adv::LeaderId {
                    term: 1,
                    node_id: 1,
                },
                index,
            ),
            payload: EntryPayload::Normal(cmd),
        };
        let raise = |index, version| entry(index, Command::SetClusterVersion { version });
        let floor = |index| entry(index, Command::RaiseEpochFloor { at_least: 9 });
        let indexes =
            |entries: &[Entry]| entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>();

        let mut entries = vec![floor(1), raise(2, 3), raise(3, 4), floor(4)];
        let mut rest = split_after_version_raise(&mut entries).unwrap();
        assert_eq!(indexes(&entries), [1, 2], "cut after the first raise");
        assert_eq!(indexes(&rest), [3, 4]);
        let last = split_after_version_raise(&mut rest).unwrap();
        assert_eq!((indexes(&rest), indexes(&last)), (vec![3], vec![4]));
        for mut entries in [
            vec![floor(4), raise(5, 5)],
            vec![floor(4), floor(5)],
            vec![],
        ] {
            let before = indexes(&entries);
            assert!(split_after_version_raise(&mut entries).is_none());
            assert_eq!(indexes(&entries), before, "a raise that ends it, or none");
        }
    }
}
