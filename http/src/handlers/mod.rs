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

/// Refuses a request whose `history` (`theirs`, if it gave one) is not this cluster's: the
/// `what` it counts (a watch's indexes, a key's revisions) mean nothing here, as a cluster
/// restored from a backup counts them again; `then` says what to do instead. 410, or 503 while
/// this node does not know its cluster yet (it is not another history).
pub(crate) fn check_history(
    node: &meta_consensus::MetaNode,
    theirs: Option<&str>,
    what: &str,
    then: &str,
) -> Result<(), ApiError> {
    let Some(theirs) = theirs else {
        return Ok(());
    };
    let Some(ours) = node.history_name() else {
        // Not ready (a member added a moment ago learns the cluster's id from the leader's
        // first message), not another history: the client keeps its state and retries.
        return Err(ApiError::Unavailable(
            "this node does not know its cluster yet; retry in a moment, or at another member"
                .into(),
        ));
    };
    match ours == theirs {
        true => Ok(()),
        false => Err(ApiError::Compacted(format!(
            "history={theirs} is not this cluster's history ({ours}): its {what} mean nothing \
             here (a cluster restored from a backup counts them again); {then}"
        ))),
    }
}
