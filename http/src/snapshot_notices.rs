//! How often a leader says, at INFO, that it streams a snapshot to a member. A member that
//! refuses snapshots (for want of room, say) is sent the same one again about twice a second;
//! one line per snapshot and member, then one every [`REPEAT_EVERY`] with the count of sends
//! in between, says as much as a line per send. Plain bookkeeping, tested without a runtime.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use meta_consensus::NodeId;

/// The least time between two INFO lines for the same snapshot to the same member.
pub(crate) const REPEAT_EVERY: Duration = Duration::from_secs(30);

/// The last INFO line per member: which snapshot file, when, and the sends since.
#[derive(Debug)]
struct Told {
    file: PathBuf,
    at: Instant,
    unlogged: u64,
}

/// The snapshot sends a leader logged at INFO, per member; shared by its connections (openraft
/// opens a new one for every snapshot it sends).
#[derive(Debug, Default)]
pub(crate) struct SnapshotNotices {
    told: Mutex<HashMap<NodeId, Told>>,
}

impl SnapshotNotices {
    /// Notes a send of `file` to `target` at `now`. `Some(n)` if it deserves an INFO line (the
    /// first send of this file to `target`, or [`REPEAT_EVERY`] after the last line), `n` being
    /// the sends of the file to `target` since the last line; `None` for a line at debug.
    pub(crate) fn sending(&self, target: NodeId, file: &Path, now: Instant) -> Option<u64> {
        let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
        match told.get_mut(&target) {
            Some(last)
                if last.file == file && now.saturating_duration_since(last.at) < REPEAT_EVERY =>
            {
                last.unlogged += 1;
                None
            }
            Some(last) if last.file == file => {
                let since = std::mem::take(&mut last.unlogged);
                last.at = now;
                Some(since)
            }
            _ => {
                let first = Told {
                    file: file.to_path_buf(),
                    at: now,
                    unlogged: 0,
                };
                told.insert(target, first);
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_snapshot_is_told_once_per_member_then_at_most_every_repeat() {
        let notices = SnapshotNotices::default();
        let t0 = Instant::now();
        let (a, b) = (Path::new("snap-a"), Path::new("snap-b"));
        assert_eq!(notices.sending(2, a, t0), Some(0), "the first send");
        assert_eq!(notices.sending(3, a, t0), Some(0), "to another member");
        let half = Duration::from_millis(500);
        for n in 1..=10 {
            assert_eq!(notices.sending(2, a, t0 + half * n), None, "send {n} again");
        }
        assert_eq!(
            notices.sending(2, a, t0 + REPEAT_EVERY),
            Some(10),
            "after the pause, with the sends since"
        );
        assert_eq!(notices.sending(2, a, t0 + REPEAT_EVERY + half), None);
        assert_eq!(
            notices.sending(2, b, t0 + REPEAT_EVERY + half),
            Some(0),
            "a newer snapshot is told at once"
        );
        assert_eq!(notices.sending(3, a, t0 + half), None, "member 3 unchanged");
    }
}
