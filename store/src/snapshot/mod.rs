//! Snapshot files: written to a temp file in the snapshot directory, paced by a
//! [`crate::rate_limit::RateLimiter`], checksummed, fsynced and renamed into place.
//!
//! A file is `header | payload | trailer`:
//! - header: magic `METASNAP`, format version (u32 LE), metadata length (u32 LE), the caller's
//!   metadata bytes, and a CRC32C of everything before it (u32 LE);
//! - payload: the caller's bytes, streamed;
//! - trailer: payload length (u64 LE), payload CRC32C (u32 LE), magic `SEND`.
//!
//! A crash at any moment leaves the earlier complete snapshots, possibly the new complete one,
//! and possibly a temp file (removed at the next [`SnapshotStore::open`]); never a partial file
//! under a final name.
//!
//! Everything here does blocking file IO (and sleeps, when paced). From async code run it on a
//! blocking thread (`tokio::task::spawn_blocking`), never on a runtime worker.

mod file;
mod format;
mod gate;
mod reader;
mod store;
mod writer;

pub use file::SnapshotFile;
pub use format::{FORMAT_VERSION, MAX_META_BYTES};
pub use reader::SnapshotReader;
pub use store::{SnapshotStore, DEFAULT_KEEP};
pub use writer::SnapshotWriter;
