//! The node's snapshot rate limiter as a handle its transport shares: the limiter paces the
//! snapshots this node exports, the downloads it serves and the snapshots it streams to
//! members, all against one budget, so that `--snapshot-rate` bounds the snapshot traffic of a
//! node whatever its cause.

use std::sync::Arc;

use meta_store::RateLimiter;

/// A shared handle on a node's snapshot rate limiter; clones share it. Unlimited until the
/// node opens with its configured rate.
#[derive(Clone)]
pub struct SnapshotPace(Arc<RateLimiter>);

impl SnapshotPace {
    /// The limiter.
    pub fn limiter(&self) -> Arc<RateLimiter> {
        self.0.clone()
    }

    /// `reader`, paced with the rest of the node's snapshot traffic.
    pub fn paced<R>(&self, reader: R) -> impl tokio::io::AsyncRead + Unpin
    where
        R: tokio::io::AsyncRead + Unpin,
    {
        meta_store::AsyncThrottledReader::new(reader, self.0.clone())
    }
}

impl Default for SnapshotPace {
    fn default() -> Self {
        SnapshotPace(Arc::new(RateLimiter::unlimited()))
    }
}

impl std::fmt::Debug for SnapshotPace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotPace")
            .field("bytes_per_sec", &self.0.rate())
            .finish()
    }
}
