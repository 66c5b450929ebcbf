//! A segmented write-ahead log whose writers share fsync barriers (group commit).
//!
//! Records are numbered by LSN and appended under a write lock; a record is readable as soon as
//! [`Wal::append`] returns and durable once a barrier (one `fdatasync`) covers it. Barriers run one
//! at a time outside the write lock; each reads how far the log was written before its sync and
//! publishes that as durable after it, so every writer whose record was written before a barrier
//! started shares it. Truncation and purge are marker records, never rewrites. See [`Wal`].

mod bit_flip;
mod index;
mod log;
mod metrics;
mod newest_segment;
mod purge;
mod record;
mod recovery;
mod segment;
mod segment_bytes;
mod waiter;

use std::time::Duration;

#[cfg(doc)]
use crate::fs::DescriptorWait;
use crate::fs::DEFAULT_DESCRIPTOR_WAIT;

pub use log::Wal;
pub use metrics::{LatencyHistogram, WalMetrics, LATENCY_BOUNDS_SECONDS};
pub use purge::Purge;
pub use record::MAX_PAYLOAD;

/// A record number. The first record has LSN 1; each record or marker takes the next one. LSNs
/// never go backwards; the LSNs of records lost in a crash before they were durable are assigned
/// again.
pub type Lsn = u64;

/// How [`Wal::sync`] and its async forms get their barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BarrierMode {
    /// Waiters share barriers: one fdatasync covers every record written before it started.
    #[default]
    Shared,
    /// Every sync request takes an fdatasync of its own, one after another (the naive design,
    /// kept as a real configuration for comparison).
    Own,
}

/// Options for [`Wal::open`].
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Target size of a segment file in bytes (default 64 MiB). A segment is started when the next
    /// record would not fit; a single record larger than this gets a segment of its own.
    pub segment_bytes: u64,
    /// Barrier mode at open; see [`Wal::set_barrier_mode`].
    pub barrier: BarrierMode,
    /// Preallocate each segment (fallocate) so that fdatasync need not update the file size.
    pub preallocate: bool,
    /// Added to every sync of [`Wal::open`]'s file system: emulates a disk with slower barriers,
    /// for benchmarks. Zero (the default) on any real deployment.
    pub extra_sync_latency: Duration,
    /// How long creating a segment or opening the log directory waits when the process is out
    /// of file descriptors (default 10 s) before the log gives up; see [`DescriptorWait`].
    pub descriptor_wait: Duration,
}

/// Smallest accepted [`WalOptions::segment_bytes`].
pub const MIN_SEGMENT_BYTES: u64 = 256;
/// Largest accepted [`WalOptions::segment_bytes`]: recovery reads a segment into memory whole,
/// and a preallocated segment takes its full size on disk.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            barrier: BarrierMode::Shared,
            preallocate: true,
            extra_sync_latency: Duration::ZERO,
            descriptor_wait: DEFAULT_DESCRIPTOR_WAIT,
        }
    }
}
