//! The change feed: a bounded in-memory history of what applied entries changed in the registry,
//! by log index, so that clients learn of changes by watching instead of polling listings.
//!
//! Every member records the changes it applies; applying is deterministic, so every member
//! records the same events under the same log indexes, and a client may move between members
//! with the index it reached. An event says what changed (a datanode registered or removed, the
//! replicas of a datanode that were added, changed or dropped, a key written or deleted), not
//! the new state: a client re-reads what it cares about. Entries that change nothing (an
//! identical re-registration of a replica, a fenced batch, a failed compare-and-swap) record no
//! event, so a restart storm that re-registers unchanged replicas wakes no watcher.
//!
//! Contracts:
//! - Every change applied after [`ChangeFeed::floor`] is kept, in log order. The history holds
//!   at most `capacity` units (an event costs one unit, plus one per shard id it names and one
//!   per 8 bytes of the key or address it names), or
//!   the newest event alone if that is larger; the oldest events go first, and the floor rises
//!   to the newest index they held.
//! - The feed starts at the applied index found at open, and starts again at a snapshot's
//!   index when one is installed: what happened before is not known to this member.
//! - [`ChangeFeed::record`] makes a batch of events and the applied index visible together,
//!   after the registry shows their writes, so a client that reads after seeing an event sees
//!   at least that change.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

/// What one applied entry changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A datanode registered (or registered again) with this address, starting incarnation
    /// `epoch`.
    DatanodeRegistered { id: u64, addr: String, epoch: u64 },
    /// A datanode was removed, and with it every replica it still held (`replicas_removed`).
    /// A removal in pieces (cluster version 3) drops its replicas first, in `ReplicasRemoved`
    /// events of its earlier entries.
    DatanodeRemoved { id: u64, replicas_removed: u64 },
    /// Replicas of these shards on `datanode` were added or changed (generation or size).
    ReplicasRegistered { datanode: u64, shards: Vec<u64> },
    /// Replicas of these shards on `datanode` were dropped.
    ReplicasRemoved { datanode: u64, shards: Vec<u64> },
    /// A key was written; its revision is the event's index.
    KvPut { key: String },
    /// A key was deleted.
    KvDeleted { key: String },
}

impl Change {
    /// The datanode the change is about, if it is a registry change.
    pub fn datanode(&self) -> Option<u64> {
        match self {
            Change::DatanodeRegistered { id, .. } | Change::DatanodeRemoved { id, .. } => Some(*id),
            Change::ReplicasRegistered { datanode, .. }
            | Change::ReplicasRemoved { datanode, .. } => Some(*datanode),
            Change::KvPut { .. } | Change::KvDeleted { .. } => None,
        }
    }

    /// The key the change is about, if it is a key-value change.
    pub fn key(&self) -> Option<&str> {
        match self {
            Change::KvPut { key } | Change::KvDeleted { key } => Some(key),
            _ => None,
        }
    }

    /// What the event costs in the history: one unit, plus one per shard id it names (8
    /// bytes each) and one per 8 bytes of the key or address it names, so that a unit stands
    /// for about the same memory whatever the events are: a key of 1,024 bytes costs 129 units,
    /// not one, like a registration of 128 shards.
    fn units(&self) -> usize {
        1 + match self {
            Change::ReplicasRegistered { shards, .. } | Change::ReplicasRemoved { shards, .. } => {
                shards.len()
            }
            Change::KvPut { key } | Change::KvDeleted { key } => key.len() / 8,
            Change::DatanodeRegistered { addr, .. } => addr.len() / 8,
            Change::DatanodeRemoved { .. } => 0,
        }
    }
}

/// A change and the log index of the entry that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeEvent {
    pub index: u64,
    pub change: Change,
}

/// Which events a watcher wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ChangeFilter {
    /// Every event.
    #[default]
    All,
    /// Registry events of one datanode (its registrations, removal and replicas).
    Datanode(u64),
    /// Key-value events of keys starting with this prefix.
    KeyPrefix(String),
}

impl ChangeFilter {
    fn matches(&self, c: &Change) -> bool {
        match self {
            ChangeFilter::All => true,
            ChangeFilter::Datanode(id) => c.datanode() == Some(*id),
            ChangeFilter::KeyPrefix(p) => c.key().is_some_and(|k| k.starts_with(p.as_str())),
        }
    }
}

/// What a watch answers: the matching events after the index asked for, in log order, and the
/// index to watch from next (every matching event up to it was returned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeBatch {
    pub events: Vec<ChangeEvent>,
    pub index: u64,
}

/// The changes after the index asked for are no longer kept (or, after a snapshot install or
/// a restart, never were on this member): the watcher must read the state again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compacted {
    /// Every change after this index is kept.
    pub floor: u64,
}

/// Most units one [`ChangeFeed::read`] returns (it returns at least one event): 64k shard ids
/// make about half a megabyte of JSON.
pub const MAX_READ_UNITS: usize = 65_536;

/// Most events one [`ChangeFeed::read`] looks at, wanted or not, while it holds the history's
/// lock (which applying needs too).
pub const MAX_READ_SCAN: usize = 65_536;

/// The default history: a million units, about a whole registration storm of the size
/// (a million replicas, some 10 MB of memory). An event's own record is about 60 bytes, so
/// a million events of one unit each (short keys) take about 70 MB; longer keys and addresses
/// cost units by their length, so no event is cheaper per byte than that.
pub const DEFAULT_HISTORY: usize = 1_000_000;

#[derive(Debug)]
struct History {
    events: VecDeque<ChangeEvent>,
    units: usize,
    capacity: usize,
    /// Every change after this index is in `events`.
    floor: u64,
    /// The applied index the events are complete up to.
    applied: u64,
    /// Units dropped since the last roll (see [`ChangeFeed::record`]).
    dropped: usize,
}

impl History {
    /// Drops the oldest events until the history fits its capacity, but never the newest
    /// event (unless the capacity is 0): an event larger than the whole history would
    /// otherwise be gone as it is recorded, and every watcher, even one that is up to date,
    /// would be told to read the state again.
    fn trim(&mut self) {
        while self.units > self.capacity && (self.capacity == 0 || self.events.len() > 1) {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.units -= old.change.units();
            self.dropped += old.change.units();
            self.floor = self.floor.max(old.index);
        }
    }
}

/// The change feed of one member (see the module comment).
#[derive(Debug)]
pub struct ChangeFeed {
    history: Mutex<History>,
    /// The applied index recorded last, for waiters; closed (sender dropped) never: a closing
    /// node calls [`ChangeFeed::close`], which sends `u64::MAX`.
    applied: watch::Sender<u64>,
    /// Watchers in [`ChangeFeed::wait_past`] now.
    waiting: AtomicUsize,
    /// The channels of the waiters with a filter, which are woken only by an event they want.
    /// Locked inside `history` (by a record, and by a waiter while it subscribes).
    wanted: Mutex<Wanted>,
    /// Counts the restarts and the close: every waiter wakes at each.
    resets: watch::Sender<u64>,
    /// Counts the rolls of the history, each time it dropped half its capacity: a filtered
    /// waiter wakes at each, to move its cursor past what it does not want before the history
    /// rolls past it.
    rolls: watch::Sender<u64>,
}

/// The channels of the waiters with a filter: each tells the index of the newest event the
/// filter wants. A record then wakes only the watchers of what changed, not every one: each
/// wake costs a member about 5 us, and a thousand datanodes watching each their own changes
/// made every write cost 5 ms of CPU.
#[derive(Debug, Default)]
struct Wanted {
    datanodes: HashMap<u64, watch::Sender<u64>>,
    prefixes: Vec<(String, watch::Sender<u64>)>,
}

impl Wanted {
    /// Tells the waiters that want `e`.
    fn tell(&self, e: &ChangeEvent) {
        if let Some(id) = e.change.datanode() {
            if let Some(tx) = self.datanodes.get(&id) {
                tx.send_replace(e.index);
            }
        }
        if let Some(key) = e.change.key() {
            for (prefix, tx) in &self.prefixes {
                if key.starts_with(prefix.as_str()) {
                    tx.send_replace(e.index);
                }
            }
        }
    }

    /// A receiver of the events `filter` wants (`None` for every event: no channel).
    fn subscribe(&mut self, filter: &ChangeFilter) -> Option<watch::Receiver<u64>> {
        match filter {
            ChangeFilter::All => None,
            ChangeFilter::Datanode(id) => Some(
                self.datanodes
                    .entry(*id)
                    .or_insert_with(|| watch::Sender::new(0))
                    .subscribe(),
            ),
            ChangeFilter::KeyPrefix(p) => {
                if let Some((_, tx)) = self.prefixes.iter().find(|(q, _)| q == p) {
                    return Some(tx.subscribe());
                }
                let (tx, rx) = watch::channel(0);
                self.prefixes.push((p.clone(), tx));
                Some(rx)
            }
        }
    }

    /// Drops the channel of `filter` once no waiter holds it.
    fn forget(&mut self, filter: &ChangeFilter) {
        match filter {
            ChangeFilter::All => {}
            ChangeFilter::Datanode(id) => {
                if self
                    .datanodes
                    .get(id)
                    .is_some_and(|tx| tx.receiver_count() == 0)
                {
                    self.datanodes.remove(id);
                }
            }
            ChangeFilter::KeyPrefix(_) => self.prefixes.retain(|(_, tx)| tx.receiver_count() > 0),
        }
    }
}

/// How a [`ChangeFeed::wait_past`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waited {
    /// Whether the feed may have moved past the index (else the time ran out).
    pub moved: bool,
    /// Every event after the index up to this one is one the filter does not want: the
    /// waiter's cursor may move here (the index itself when that is not known).
    pub quiet_until: u64,
}

/// A filtered waiter's channel, given up when the wait ends or is dropped (a client that went
/// away): the feed drops the channel with its last waiter.
struct Subscription<'a> {
    feed: &'a ChangeFeed,
    filter: &'a ChangeFilter,
    rx: Option<watch::Receiver<u64>>,
}

impl Subscription<'_> {
    /// The index of the newest event the filter wanted.
    fn current(&self) -> u64 {
        *self.rx.as_ref().expect("held until dropped").borrow()
    }

    /// Resolves at the filter's next event (or never, if its channel is gone).
    async fn changed(&mut self) {
        let rx = self.rx.as_mut().expect("held until dropped");
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        drop(self.rx.take());
        self.feed.wanted.lock().forget(self.filter);
    }
}

/// Counts a waiter while it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ChangeFeed {
    /// A feed that knows every change after `applied` (none yet) and keeps `capacity` units.
    pub fn new(applied: u64, capacity: usize) -> Self {
        ChangeFeed {
            history: Mutex::new(History {
                events: VecDeque::new(),
                units: 0,
                capacity,
                floor: applied,
                applied,
                dropped: 0,
            }),
            applied: watch::Sender::new(applied),
            waiting: AtomicUsize::new(0),
            wanted: Mutex::new(Wanted::default()),
            resets: watch::Sender::new(0),
            rolls: watch::Sender::new(0),
        }
    }

    /// Keeps at most `capacity` units from now on (dropping the oldest events at once).
    pub fn set_capacity(&self, capacity: usize) {
        let mut h = self.history.lock();
        h.capacity = capacity;
        h.trim();
    }

    /// Every change after this index is kept.
    pub fn floor(&self) -> u64 {
        self.history.lock().floor
    }

    /// The applied index the feed is complete up to.
    pub fn applied(&self) -> u64 {
        self.history.lock().applied
    }

    /// Records `events` (log order, after every event recorded before) and that the registry
    /// applied every entry up to `applied`; wakes the waiters. Call after the registry shows
    /// the events' writes.
    pub fn record(&self, events: Vec<ChangeEvent>, applied: u64) {
        {
            let mut h = self.history.lock();
            let wanted = self.wanted.lock();
            for e in &events {
                wanted.tell(e);
            }
            drop(wanted);
            for e in events {
                h.units += e.change.units();
                h.events.push_back(e);
            }
            h.applied = h.applied.max(applied);
            h.trim();
            if h.dropped > 0 && h.dropped >= h.capacity / 2 {
                h.dropped = 0;
                self.rolls.send_modify(|n| *n += 1);
            }
        }
        self.applied.send_if_modified(|a| {
            let newer = applied > *a && *a != u64::MAX;
            if newer {
                *a = applied;
            }
            newer
        });
    }

    /// Forgets every event: the registry was replaced by a snapshot taken at `applied`, and
    /// what changed before it is not known here.
    pub fn restart_at(&self, applied: u64) {
        {
            let mut h = self.history.lock();
            h.events.clear();
            h.units = 0;
            h.floor = applied;
            h.applied = applied;
            // Under the lock: a waiter reads it with the history (see `wait_past`).
            self.resets.send_modify(|n| *n += 1);
        }
        self.applied.send_if_modified(|a| {
            let changed = *a != applied && *a != u64::MAX;
            if changed {
                *a = applied;
            }
            changed
        });
    }

    /// Wakes every waiter for good: the node is closing.
    pub fn close(&self) {
        self.applied.send_replace(u64::MAX);
        self.resets.send_modify(|n| *n += 1);
    }

    /// The events after `after` that `filter` wants, at most `limit` events and about
    /// [`MAX_READ_UNITS`] units (at least one event), and the index to read from next.
    /// [`Compacted`] if changes after `after` are no longer kept.
    pub fn read(
        &self,
        after: u64,
        filter: &ChangeFilter,
        limit: usize,
    ) -> Result<ChangeBatch, Compacted> {
        let h = self.history.lock();
        if after < h.floor {
            return Err(Compacted { floor: h.floor });
        }
        let start = h.events.partition_point(|e| e.index <= after);
        let mut events = Vec::new();
        let mut units = 0;
        // Every event up to this index was returned or is not wanted. Each entry makes at most
        // one event, so a read may stop between any two.
        let mut looked_at = after;
        for (scanned, e) in h.events.range(start..).enumerate() {
            let full =
                events.len() >= limit.max(1) || (units >= MAX_READ_UNITS && !events.is_empty());
            if full || scanned >= MAX_READ_SCAN {
                // The next read starts after the last event looked at; the lock is not held
                // meanwhile, so a narrow filter over a long history does not stall applying.
                return Ok(ChangeBatch {
                    events,
                    index: looked_at,
                });
            }
            looked_at = e.index;
            if filter.matches(&e.change) {
                units += e.change.units();
                events.push(e.clone());
            }
        }
        Ok(ChangeBatch {
            events,
            index: h.applied.max(after),
        })
    }

    /// Waits until the feed records an applied index above `index` with an event `filter`
    /// wants (any applied index above it, for [`ChangeFilter::All`]), the feed starts again or
    /// closes, or `timeout` passes. At once if the feed applied past `index` already: a read
    /// that stopped short of it reads on.
    pub async fn wait_past(&self, index: u64, filter: &ChangeFilter, timeout: Duration) -> Waited {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _counted = Waiting(&self.waiting);
        let unmoved = |moved| Waited {
            moved,
            quiet_until: index,
        };
        if *filter == ChangeFilter::All {
            let mut rx = self.applied.subscribe();
            // u64::MAX is the closed feed, which ends every wait (also one past u64::MAX - 1).
            let moved =
                tokio::time::timeout(timeout, rx.wait_for(|a| *a > index || *a == u64::MAX)).await;
            return unmoved(matches!(moved, Ok(Ok(_))));
        }
        // Subscribed under the history's lock: a record either came before (and the applied
        // index shows it) or tells this waiter's channel.
        let (mut wanted, mut resets, mut rolls, seen) = {
            let h = self.history.lock();
            if h.applied > index {
                return unmoved(true);
            }
            let resets = self.resets.subscribe();
            let rolls = self.rolls.subscribe();
            let rx = self.wanted.lock().subscribe(filter);
            let wanted = Subscription {
                feed: self,
                filter,
                rx: Some(rx.expect("a filter has a channel")),
            };
            let seen = (wanted.current(), *resets.borrow());
            (wanted, resets, rolls, seen)
        };
        // A close before the subscription shows here, one after it in `resets`.
        if self.closed() {
            return unmoved(true);
        }
        let moved = tokio::time::timeout(timeout, async {
            tokio::select! {
                _ = wanted.changed() => {}
                _ = resets.changed() => {}
                _ = rolls.changed() => {}
            }
        })
        .await
        .is_ok();
        // Read with the history, which the records tell the channels under: when neither the
        // filter's channel nor the restarts moved, every event up to the applied index is one
        // the filter does not want, and the cursor may pass them (else the history, rolling on
        // past it, would answer a cursor that missed nothing 410 `compacted`).
        let h = self.history.lock();
        let quiet = (wanted.current(), *resets.borrow()) == seen;
        Waited {
            moved,
            quiet_until: if quiet { h.applied.max(index) } else { index },
        }
    }

    /// Watchers waiting for a change now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Whether [`ChangeFeed::close`] was called.
    pub fn closed(&self) -> bool {
        *self.applied.borrow() == u64::MAX
    }
}

#[cfg(test)]
mod tests;
