//! Watching: long polls on the change feed (`change_feed.rs`), so that clients that route by
//! the shard map or follow keys learn of changes without polling listings.

use std::time::Duration;

use tokio::time::Instant;

use super::MetaNode;
use crate::change_feed::{ChangeBatch, ChangeFilter};
use crate::error::{Error, Result};

impl MetaNode {
    /// The changes after log index `after` that `filter` wants (at most `limit` events), in
    /// log order, and the index to watch from next; waits up to `wait` for one if there is
    /// none yet, then answers none. Without `after` it answers at once, with no events and
    /// the index to start from (list the state after this call, then watch from that index).
    ///
    /// Contract: when `read_index` is above 0 (a read index from [`MetaNode::read_index`],
    /// possibly the leader's), it first waits until this node applied it, so the answer
    /// covers every change committed before the read index was taken ([`Error::Timeout`] if
    /// that takes longer than the request timeout). A long poll (`after` given, `wait` not
    /// zero) is the exception: `wait` bounds the whole call, the wait to apply included, and a
    /// member still behind the read index when it runs out (or after the request timeout)
    /// answers what it has applied (its answer's index then says how far it covers). Every
    /// change after `after` up to the returned index that `filter` wants is in the answer or
    /// in those after it. The events
    /// are committed: they are never undone. [`Error::Compacted`] if this node no longer keeps
    /// (or never kept: a restart, a snapshot install) the changes after `after`;
    /// [`Error::InvalidArgument`] if `after` is past `read_index`. Once the node starts to
    /// close ([`MetaNode::begin_close`]) it answers at once, with what it applied if it was
    /// still waiting to apply (without `after`: [`Error::Shutdown`]). A node removed from the
    /// cluster answers [`Error::Removed`], one its voters refuse [`Error::RefusedByMembers`].
    pub async fn watch(
        &self,
        after: Option<u64>,
        read_index: u64,
        filter: ChangeFilter,
        limit: usize,
        wait: Duration,
    ) -> Result<ChangeBatch> {
        self.check_open()?;
        self.check_serving()?;
        // The wait counts from the call: a member that must first catch up does not make a
        // long poll outlast what its client (or a proxy in between) waits for.
        let deadline = Instant::now() + wait;
        let feed = &self.inner.sm.feed;
        if read_index > feed.applied() {
            let timeout = self.inner.cfg.request_timeout;
            let long_poll = after.is_some() && !wait.is_zero();
            let patience = if long_poll {
                wait.min(timeout)
            } else {
                timeout
            };
            let applied = tokio::select! {
                applied = self.wait_applied(read_index, patience) => applied,
                _ = self.closing() => Err(Error::Shutdown),
            };
            match applied {
                Ok(()) => {}
                // Out of time, or closing: answer what this member applied (a long poll
                // longer than the request timeout waits on this member's feed for the rest).
                Err(Error::Timeout) if long_poll => {}
                Err(Error::Shutdown | Error::Stopped(_)) if after.is_some() && feed.closed() => {}
                Err(e) => return Err(e),
            }
        }
        let Some(mut after) = after else {
            return Ok(ChangeBatch {
                events: Vec::new(),
                index: feed.applied(),
            });
        };
        // No member handed out an index past the leader's commit index: this one comes from
        // elsewhere (a cluster restored from a backup counts its indexes from 1 again), and
        // waiting for the log to reach it would skip every change until then.
        if read_index > 0 && after > read_index {
            return Err(Error::InvalidArgument(format!(
                "after={after} is past the cluster's newest index ({read_index}): it was not \
                 handed out by this cluster (one restored from a backup starts its indexes \
                 again); read the state again and watch from a fresh index"
            )));
        }
        loop {
            let batch = feed
                .read(after, &filter, limit)
                .map_err(|c| Error::Compacted {
                    after,
                    floor: c.floor,
                })?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if !batch.events.is_empty() || remaining.is_zero() || feed.closed() {
                return Ok(batch);
            }
            // Nothing wanted up to batch.index: wait for entries past it, and pass those the
            // filter does not want.
            after = batch.index;
            after = feed.wait_past(after, &filter, remaining).await.quiet_until;
        }
    }

    /// The node is about to stop, and nothing long-lived may hold its drain: answers every
    /// running watch at once (and every later one without waiting), ends the replication
    /// streams from the leader ([`MetaNode::closing`]), and lifts the snapshot rate, so that a
    /// paced export or download still running finishes at full speed (a pause it sleeps in
    /// ends) instead of holding the drain for as long as the rate asks.
    pub fn begin_close(&self) {
        self.inner.sm.feed.close();
        self.inner.closing.send_replace(true);
        self.inner.sm.limiter.set_rate(0);
    }

    /// The name of the history this node's log indexes count ([`crate::history_name`] of its
    /// cluster id); `None` while it belongs to no cluster.
    pub fn history_name(&self) -> Option<String> {
        self.cluster_id().map(crate::history_name)
    }

    /// Whether [`MetaNode::begin_close`] was called.
    pub fn is_closing(&self) -> bool {
        *self.inner.closing.borrow()
    }

    /// Resolves once [`MetaNode::begin_close`] was called (at once if it was).
    pub async fn closing(&self) {
        let mut rx = self.inner.closing.subscribe();
        let _ = rx.wait_for(|closing| *closing).await;
    }

    /// Every change after this log index is kept by this node's change feed.
    pub fn watch_floor(&self) -> u64 {
        self.inner.sm.feed.floor()
    }

    /// The newest log index this node's change feed applied: every index up to it was handed
    /// out by this cluster.
    pub fn feed_applied(&self) -> u64 {
        self.inner.sm.feed.applied()
    }

    /// [`Error::Compacted`] if this node no longer keeps the changes after `after`, as
    /// [`MetaNode::watch`] would answer once it got its read index: the feed's floor only
    /// rises, so a watch may be told at once rather than after asking a leader, which may
    /// take its whole wait on a member that knows none. Before that, the refusals
    /// [`MetaNode::watch`] gives whatever `after` is (a closed, removed or refused node).
    pub fn check_watch_from(&self, after: u64) -> Result<()> {
        self.check_open()?;
        self.check_serving()?;
        let floor = self.inner.sm.feed.floor();
        if after < floor {
            return Err(Error::Compacted { after, floor });
        }
        Ok(())
    }
}
