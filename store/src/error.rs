//! The error type of the `meta-store` crate.

use std::path::PathBuf;

/// Everything that can go wrong in `meta-store`. Each variant names the operation and, where
/// there is one, the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An IO call failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A barrier (fdatasync) failed earlier; the log refuses every further write and wait.
    #[error("write-ahead log is poisoned: {0}")]
    Poisoned(String),
    /// A record or file failed verification.
    #[error("corrupt data in {path} at offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A file in a format this build does not read (written by a newer build): not damage, so
    /// nothing sets it aside.
    #[error("unsupported format in {path}: {reason}")]
    Unsupported { path: PathBuf, reason: String },
    /// The caller asked for something the log cannot do (for example an LSN out of range).
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
    /// The log or writer was closed.
    #[error("closed")]
    Closed,
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an IO error with the operation and path it came from.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
