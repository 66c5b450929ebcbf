//! The key-value space as a batch applies it: writes and deletes with compare-and-swap on a
//! key's revision, and a restore's own writes, which alone go on while a restore that holds
//! keys back runs (cluster version 9).

use super::ApplyBatch;
use crate::change_feed::Change;
use crate::command::CommandResult;
use crate::error::Result;
use crate::keys;
use crate::records::KvRecord;

impl ApplyBatch {
    /// The key's current revision (0 if absent), or the `RevisionMismatch` result when
    /// `if_revision` asks for another one.
    fn check_revision(
        &self,
        k: &[u8],
        if_revision: Option<u64>,
    ) -> Result<std::result::Result<u64, CommandResult>> {
        let current = self
            .get::<KvRecord>(k, "kv")?
            .map(|r| r.revision)
            .unwrap_or(0);
        Ok(match if_revision {
            Some(want) if want != current => Err(CommandResult::RevisionMismatch { current }),
            _ => Ok(current),
        })
    }

    /// A client's write of a key (`Put`), refused while a restore that holds keys back runs.
    pub(super) fn put_kv(
        &mut self,
        index: u64,
        key: &str,
        value: &[u8],
        if_revision: Option<u64>,
    ) -> Result<CommandResult> {
        if let Some(refused) = self.refused_key_write()? {
            return Ok(refused);
        }
        self.write_kv(index, key, value, if_revision)
    }

    /// Writes the key if its revision is `if_revision` (if given); its revision is `index`.
    fn write_kv(
        &mut self,
        index: u64,
        key: &str,
        value: &[u8],
        if_revision: Option<u64>,
    ) -> Result<CommandResult> {
        let k = keys::kv(key);
        if let Err(mismatch) = self.check_revision(&k, if_revision)? {
            return Ok(mismatch);
        }
        self.put(
            &k,
            &KvRecord {
                value: value.to_vec(),
                revision: index,
            },
        )?;
        self.changed(index, Change::KvPut { key: key.into() });
        Ok(CommandResult::Put { revision: index })
    }

    /// A client's delete of a key (`Delete`), refused while a restore that holds keys back runs.
    pub(super) fn delete_kv(
        &mut self,
        index: u64,
        key: &str,
        if_revision: Option<u64>,
    ) -> Result<CommandResult> {
        if let Some(refused) = self.refused_key_write()? {
            return Ok(refused);
        }
        let k = keys::kv(key);
        let current = match self.check_revision(&k, if_revision)? {
            Ok(current) => current,
            Err(mismatch) => return Ok(mismatch),
        };
        let existed = current != 0;
        if existed {
            self.remove(&k);
            self.changed(index, Change::KvDeleted { key: key.into() });
        }
        Ok(CommandResult::Deleted {
            existed,
            revision: index,
        })
    }

    /// A restore's write of a key of its backup (`RestorePut`): as a `Put` that the key must
    /// not exist for, taken only while the cluster holds a restore's mark.
    pub(super) fn restore_put(
        &mut self,
        index: u64,
        key: &str,
        value: &[u8],
    ) -> Result<CommandResult> {
        if self.restore_mark()?.is_none() {
            return Ok(CommandResult::NotRestoring);
        }
        self.write_kv(index, key, value, Some(0))
    }

    /// The refusal of a client's key write or delete while a restore that holds keys back
    /// runs (its claim was `BeginRestoreHoldingKeys`); `None` when it may go on.
    fn refused_key_write(&self) -> Result<Option<CommandResult>> {
        Ok(self
            .get::<u64>(keys::RESTORE_KEYS_HELD, "restore's hold on keys")?
            .map(|claimed_at| CommandResult::RestoreUnderWay { claimed_at }))
    }
}
