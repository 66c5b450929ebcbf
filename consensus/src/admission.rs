//! The leader's admission window (`max_pending_shards`): writes in flight (proposed, not yet
//! answered by openraft) may hold at most that many shards between them, so the applied index
//! stays close to the committed one and a linearizable read never queues behind more than that
//! much apply work.
//!
//! Small writes (a key, a datanode's registration, a batch of a few shards: at most
//! [`SMALL_WRITE_WEIGHT`] shards) have a lane of their own, a sixteenth of the window: during a
//! registration storm, whose batches of a thousand shards fill the window many times over, an
//! operator's key write or a datanode's single new replica waits only for the work already
//! admitted, not for every batch queued before it (the window hands out room first come, first
//! served). A read may so queue behind the window and the lane together.

use std::sync::Arc;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// The most shards a write may weigh to go through the small writes' lane.
pub const SMALL_WRITE_WEIGHT: u32 = 16;

/// Room for writes in flight, in shards: the window, and the small writes' lane beside it.
#[derive(Debug)]
pub struct Admission {
    window: Arc<Semaphore>,
    window_size: u32,
    lane: Arc<Semaphore>,
    lane_size: u32,
}

impl Admission {
    /// A window of `window` shards (at least 1), with a lane of a sixteenth of it (at least 1)
    /// for small writes.
    pub fn new(window: u32) -> Self {
        let window_size = window.max(1);
        let lane_size = (window_size / 16).max(1);
        Admission {
            window: Arc::new(Semaphore::new(window_size as usize)),
            window_size,
            lane: Arc::new(Semaphore::new(lane_size as usize)),
            lane_size,
        }
    }

    /// Waits for room for a write of `weight` shards (a write of none takes one; one larger
    /// than its room takes all of it, and runs alone) and returns it: held until dropped. Small
    /// writes take room in their lane, the others in the window. Fails only once closed.
    pub async fn room(&self, weight: u32) -> Result<OwnedSemaphorePermit, AcquireError> {
        let (room, size) = match weight <= SMALL_WRITE_WEIGHT {
            true => (&self.lane, self.lane_size),
            false => (&self.window, self.window_size),
        };
        room.clone().acquire_many_owned(weight.clamp(1, size)).await
    }

    /// Shards that writes in flight hold, in the window and the lane together.
    pub fn pending(&self) -> u64 {
        let held = |room: &Semaphore, size: u32| {
            u64::from(size).saturating_sub(room.available_permits() as u64)
        };
        held(&self.window, self.window_size) + held(&self.lane, self.lane_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    /// Room for a write of `weight`, which must be free now (a test that would wait fails).
    fn at_once(admission: &Admission, weight: u32) -> OwnedSemaphorePermit {
        let room = admission.room(weight).now_or_never();
        room.expect("room at once").unwrap()
    }

    /// A small write is admitted while big ones fill the window and more wait for it; a big
    /// write still waits its turn, and a write larger than its room takes all of it.
    #[tokio::test]
    async fn a_small_write_passes_big_ones_waiting_for_the_window() {
        let admission = Admission::new(4_096);
        let big = at_once(&admission, 4_096);
        assert_eq!(admission.pending(), 4_096);
        // A big write waits for the window, queued.
        let mut waiting = Box::pin(admission.room(1_000));
        assert!(futures::poll!(&mut waiting).is_pending());
        // A small one is admitted meanwhile; a big one still waits its turn.
        let small = at_once(&admission, 1);
        let keyed = at_once(&admission, 0);
        assert_eq!(admission.pending(), 4_098);
        assert!(admission.room(17).now_or_never().is_none());
        drop(big);
        drop(waiting.await.unwrap());
        drop((small, keyed));
        assert_eq!(admission.pending(), 0);
        // The lane is a sixteenth of the window: a write of 16 shards fits, a larger one goes
        // through the window; one larger than the window takes all of it.
        let lane = at_once(&admission, SMALL_WRITE_WEIGHT);
        let window = at_once(&admission, 100_000);
        assert_eq!(admission.pending(), 16 + 4_096);
        drop((lane, window));
    }

    /// The lane of a small window is one shard: small writes go one at a time.
    #[tokio::test]
    async fn a_small_window_has_a_lane_of_one() {
        let admission = Admission::new(3);
        let first = at_once(&admission, 20);
        let small = at_once(&admission, 2);
        assert_eq!(admission.pending(), 4);
        assert!(
            admission.room(1).now_or_never().is_none(),
            "the lane of one shard is held"
        );
        drop(small);
        assert!(admission.room(1).now_or_never().is_some());
        drop(first);
    }
}
