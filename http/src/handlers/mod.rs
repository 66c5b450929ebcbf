//! The admin API's handlers, one file per resource. Each validates its input completely
//! before it calls the node, so a refused request changes nothing.

pub mod cluster;
pub mod datanodes;
pub mod kv;
pub mod probes;
pub mod shards;
pub mod watch;

use meta_consensus::{CommandResult, Consistency, ShardEntry};

use crate::error::ApiError;
use crate::request::{invalid_cursor, ReadConsistency};
use crate::response::ShardEntryView;

impl From<ReadConsistency> for Consistency {
    fn from(c: ReadConsistency) -> Consistency {
        match c {
            ReadConsistency::Linearizable => Consistency::Linearizable,
            ReadConsistency::Local => Consistency::Local,
            ReadConsistency::Lease => Consistency::Lease,
        }
    }
}

impl From<ShardEntry> for ShardEntryView {
    fn from(e: ShardEntry) -> Self {
        ShardEntryView {
            id: e.shard,
            datanode: e.datanode,
            generation: e.generation,
            size: e.size,
        }
    }
}

/// Maps a node error of a listing: the only argument the node checks there is the cursor.
pub(crate) fn listing_error(
    cursor: Option<&str>,
) -> impl Fn(meta_consensus::Error) -> ApiError + '_ {
    move |e| match e {
        meta_consensus::Error::InvalidArgument(_) => invalid_cursor(cursor.unwrap_or_default()),
        other => other.into(),
    }
}

/// A result the command cannot produce: a bug, reported as 500.
pub(crate) fn unexpected(result: CommandResult) -> ApiError {
    ApiError::Internal(format!("unexpected command result {result:?}"))
}
