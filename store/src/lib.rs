//! Durable storage for the metaserver, with no knowledge of Raft or HTTP.
//!
//! - [`wal`]: a segmented write-ahead log whose writers share fsync barriers (group commit).
//! - [`rate_limit`]: an accumulating byte-rate limiter and the writers that use it.
//! - [`snapshot`]: snapshot files written to a temp file, fsynced and renamed into place.
//! - [`fs`]: the small file-system trait behind which all file access sits, so tests can inject faults.

mod barrier;
pub mod error;
pub mod fs;
pub mod rate_limit;
pub mod snapshot;
pub mod wal;

pub use error::{Error, Result};
pub use fs::{FileSystem, OsFileSystem};
pub use rate_limit::{AsyncThrottledReader, AsyncThrottledWriter, RateLimiter, ThrottledWriter};
pub use snapshot::{SnapshotFile, SnapshotReader, SnapshotStore, SnapshotWriter};
pub use wal::{
    BarrierMode, Lsn, Purge, Wal, WalMetrics, WalOptions, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES,
};
