//! The cluster's settings as the state machine serves them that are read from the registry
//! rather than kept in memory: a restore's mark.

use super::SmShared;
use crate::error::Result;
use crate::keys;
use crate::records::RestoreMark;

impl SmShared {
    /// The restore's mark as applied (`Command::BeginRestore`): a restore under way, or cut
    /// off, that did not end. Blocking (sled).
    pub(crate) fn restore_mark(&self) -> Result<Option<RestoreMark>> {
        self.read_through(
            |batch| batch.pending::<RestoreMark>(keys::RESTORE_MARK, "restore mark"),
            |registry| registry.current().restore_mark(),
        )
    }
}
