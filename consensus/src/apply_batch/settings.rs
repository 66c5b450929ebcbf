//! The cluster's settings as a batch applies them: its version, its epoch floor, and a
//! restore's claim on a fresh cluster, with the mark it keeps until the restore ends.

use super::{ApplyBatch, Pending};
use crate::cluster_version::BASE_VERSION;
use crate::command::CommandResult;
use crate::error::{Error, Result};
use crate::keys;
use crate::records::{RestoreMark, RestoreOrigin};

impl ApplyBatch {
    /// The cluster's version as the registry and this batch leave it (`cluster_version.rs`).
    pub(crate) fn cluster_version(&self) -> Result<u32> {
        Ok(self
            .get::<u32>(keys::CLUSTER_VERSION, "cluster version")?
            .unwrap_or(BASE_VERSION))
    }

    /// Raises the cluster's version to `version`; a lower one changes nothing.
    pub(super) fn set_cluster_version(&mut self, version: u32) -> Result<CommandResult> {
        let current = self.cluster_version()?;
        if version > current {
            self.put(keys::CLUSTER_VERSION, &version)?;
        }
        Ok(CommandResult::ClusterVersion {
            version: version.max(current),
        })
    }

    /// The cluster's epoch floor (`keys::CLUSTER_EPOCH_FLOOR`), 0 until first raised.
    pub(super) fn cluster_epoch_floor(&self) -> Result<u64> {
        Ok(self
            .get::<u64>(keys::CLUSTER_EPOCH_FLOOR, "cluster epoch floor")?
            .unwrap_or(0))
    }

    /// Raises the cluster's epoch floor to `at_least`; a lower one changes nothing.
    pub(super) fn raise_epoch_floor(&mut self, at_least: u64) -> Result<CommandResult> {
        let current = self.cluster_epoch_floor()?;
        if at_least > current {
            self.put(keys::CLUSTER_EPOCH_FLOOR, &at_least)?;
        }
        Ok(CommandResult::EpochFloor {
            floor: at_least.max(current),
        })
    }

    /// Raises the epoch floor to `at_least` if the cluster is fresh: it holds no datanode, no
    /// key, and its floor was never raised (by an earlier claim, say). Else `NotFresh`.
    pub(super) fn claim_for_restore(&mut self, at_least: u64) -> Result<CommandResult> {
        let floor = self.cluster_epoch_floor()?;
        let datanodes = self.holds_any(keys::DATANODE)?;
        let kv = self.holds_any(keys::KV)?;
        if floor > 0 || datanodes || kv || at_least == 0 {
            return Ok(CommandResult::NotFresh {
                floor,
                datanodes,
                keys: kv,
            });
        }
        self.raise_epoch_floor(at_least)
    }

    /// A restore's claim (`claim_for_restore`) at log `index` that also marks the cluster as
    /// being restored from `origin`, if it took the cluster.
    pub(super) fn begin_restore(
        &mut self,
        index: u64,
        at_least: u64,
        origin: &RestoreOrigin,
    ) -> Result<CommandResult> {
        let claimed = self.claim_for_restore(at_least)?;
        if let CommandResult::EpochFloor { .. } = claimed {
            let mark = RestoreMark {
                claimed_at: index,
                floor: at_least,
                origin: *origin,
            };
            self.put(keys::RESTORE_MARK, &mark)?;
        }
        Ok(claimed)
    }

    /// The restore's mark, as this batch leaves it (`None`: no restore under way or cut off).
    pub(super) fn restore_mark(&self) -> Result<Option<RestoreMark>> {
        self.get::<RestoreMark>(keys::RESTORE_MARK, "restore mark")
    }

    /// The refusal of a datanode's command while a restore runs (the cluster holds its mark):
    /// a registration that does not ask for an epoch of at least the restore's floor
    /// (`min_epoch`, which the restore's own registrations give), and a drop of replicas not
    /// fenced by an epoch. `None` when the command may go on.
    pub(super) fn refused_while_restoring(&self, min_epoch: u64) -> Result<Option<CommandResult>> {
        Ok(self
            .restore_mark()?
            .filter(|mark| min_epoch < mark.floor)
            .map(|mark| CommandResult::RestoreUnderWay {
                claimed_at: mark.claimed_at,
            }))
    }

    /// Removes the restore's mark, if there is one.
    pub(super) fn end_restore(&mut self) -> Result<CommandResult> {
        let ended = self.restore_mark()?;
        if ended.is_some() {
            self.remove(keys::RESTORE_MARK);
            self.remove(keys::RESTORE_KEYS_HELD);
        }
        Ok(CommandResult::RestoreEnded { ended })
    }

    /// Whether the registry, as this batch leaves it, holds a key under `prefix`.
    fn holds_any(&self, prefix: u8) -> Result<bool> {
        let mut pending = self.pending.range(vec![prefix]..vec![prefix + 1]);
        if pending.any(|(_, p)| !matches!(p, Pending::Raw(None))) {
            return Ok(true);
        }
        for item in self.tree.scan_prefix([prefix]) {
            let (key, _) = item.map_err(|e| Error::registry("read during apply", e))?;
            // One this batch deletes does not count.
            if !matches!(self.pending.get(key.as_ref()), Some(Pending::Raw(None))) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
