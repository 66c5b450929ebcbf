//! How long a leader waits before it sends a snapshot again to a member that refused the last
//! one for want of room. openraft sends again after its constant backoff (half a second), and a
//! member short of space refuses every one until space is freed: the leader read and sent
//! megabytes twice a second for nothing. The wait doubles per refusal, from [`FIRST`] to
//! [`MAX`]; a member that takes a snapshot, or refuses one for another reason, waits no more.
//! Plain bookkeeping, tested with its own clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use meta_consensus::NodeId;

/// The wait after a first refusal for want of room.
pub(super) const FIRST: Duration = Duration::from_secs(1);
/// The longest wait: a member whose space was freed gets a snapshot within it.
pub(super) const MAX: Duration = Duration::from_secs(30);

/// How a member's refusal of a snapshot for want of room begins
/// (`meta_consensus::Error::NoRoomForSnapshot`).
pub(super) const ROOM_REFUSAL: &str = "no room for a snapshot from the leader";

/// The refusals for want of room, per member: when the last came, and the wait after it.
#[derive(Debug, Default)]
pub(super) struct RoomBackoff(Mutex<HashMap<NodeId, (Instant, Duration)>>);

impl RoomBackoff {
    /// Whether a member's answer to a snapshot, `message`, refuses it for want of room.
    pub(super) fn is_room_refusal(message: &str) -> bool {
        message.contains(ROOM_REFUSAL)
    }

    /// `target` refused a snapshot for want of room at `now`: the next waits [`FIRST`], or
    /// twice the last wait, at most [`MAX`].
    pub(super) fn refused(&self, target: NodeId, now: Instant) {
        let mut waits = self.waits();
        let wait = match waits.get(&target) {
            Some((_, last)) => (*last * 2).min(MAX),
            None => FIRST,
        };
        waits.insert(target, (now, wait));
    }

    /// `target` took a snapshot, or refused one for another reason: the next is sent at once.
    pub(super) fn cleared(&self, target: NodeId) {
        self.waits().remove(&target);
    }

    /// How long to wait at `now` before a snapshot is sent to `target`, if at all.
    pub(super) fn wait(&self, target: NodeId, now: Instant) -> Option<Duration> {
        let (at, wait) = *self.waits().get(&target)?;
        let left = (at + wait).saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// The map (a poisoned lock's map is still sound).
    fn waits(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, (Instant, Duration)>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_per_refusal_up_to_the_most_and_ends_when_one_is_taken() {
        let backoff = RoomBackoff::default();
        let t0 = Instant::now();
        assert_eq!(backoff.wait(2, t0), None, "nothing refused yet");
        backoff.refused(2, t0);
        assert_eq!(backoff.wait(2, t0), Some(FIRST));
        assert_eq!(backoff.wait(2, t0 + FIRST / 4), Some(FIRST * 3 / 4));
        assert_eq!(backoff.wait(2, t0 + FIRST), None);
        assert_eq!(
            backoff.wait(3, t0),
            None,
            "another member waits for nothing"
        );
        let mut at = t0 + FIRST;
        let mut waits = Vec::new();
        for _ in 0..7 {
            backoff.refused(2, at);
            let wait = backoff.wait(2, at).unwrap();
            waits.push(wait.as_secs());
            at += wait;
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30]);
        backoff.cleared(2);
        assert_eq!(backoff.wait(2, at), None);
        backoff.refused(2, at);
        assert_eq!(backoff.wait(2, at), Some(FIRST), "from the start again");
        // As the member's refusal reaches the leader: its error's text, after the member's id.
        let refusal = meta_consensus::Error::NoRoomForSnapshot {
            bytes: 5,
            free: 1,
            need: 9,
        };
        assert!(RoomBackoff::is_room_refusal(&format!("node 2: {refusal}")));
        assert!(!RoomBackoff::is_room_refusal(
            "node 2: the node is shutting down"
        ));
    }
}
