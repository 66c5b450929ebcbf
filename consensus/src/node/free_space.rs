//! The free-space guard: the leader refuses writes that add data while the file system of its
//! data dir has less than `min_free_bytes` free, so that a filling disk stops writes with a
//! clear answer (507) before the log or the registry runs out of space (which stops the node,
//! and a registry that failed a write must then be rebuilt). Writes that remove data (a key, a
//! replica, a datanode) still pass: they are how an operator makes room. Reads always pass.
//!
//! A member of any role also refuses a snapshot from the leader that would leave less than
//! `min_free_bytes` free, while it arrives and before it is installed: an install that runs
//! out of space would stop the node, while a refused one leaves it as it was, behind but
//! serving, and the leader sends it again later. The room an install takes is checked also
//! when `min_free_bytes` is 0.

use std::time::{Duration, Instant};

use openraft::async_runtime::watch::WatchReceiver as _;

use super::MetaNode;
use crate::command::Command;
use crate::error::{Error, Result};
use crate::snapshot_format::ImportRecords;
use crate::types::NodeId;

/// How long a reading of the free space is used before the next one.
const RECHECK: Duration = Duration::from_millis(100);

/// A refused snapshot is logged as a warning at most this often: the leader sends it again
/// about twice a second while the disk stays full, and the count is in the metrics.
const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(30);

/// The room a registry generation imported from a snapshot takes in sled, per record of the
/// payload, per datanode index entry the import derives, per two bytes of the payload, and
/// whatever the counts: fitted to imports measured into fresh registries (from 0.3 to 81 MB
/// snapshots, shard ids consecutive, scattered over 48 bits, or in between, and keys of up to
/// 1 MiB), it asks 1.13 to 1.42 times what they took (sled's files took 2.1 times the snapshot
/// with consecutive ids, 8.1 times with scattered ones and up to 16 times with ids a few to a
/// bucket, each from a different datanode: an index entry takes about 200 bytes). The old
/// generation is freed only after.
const ROOM_PER_RECORD: u64 = 64;
const ROOM_PER_INDEX_ENTRY: u64 = 224;
const ROOM_PER_TWO_BYTES: u64 = 5;
const ROOM_FIXED: u64 = 4 << 20;

/// The free space receiving and installing a snapshot of `bytes` whose import writes `records`
/// needs, keeping `reserve` free after, less the `landed` bytes of it the file system holds
/// already (the received file's blocks: rounded up, they may be more than its bytes). The
/// received file stays (moved into the snapshot dir, or copied there when it cannot be moved,
/// which its own room covers once it is deleted). With the records not yet counted (zero), this
/// is a lower bound of the room the counted ones need.
fn install_room(bytes: u64, records: ImportRecords, reserve: u64, landed: u64) -> u64 {
    let registry = records
        .pairs
        .saturating_mul(ROOM_PER_RECORD)
        .saturating_add(records.index_entries.saturating_mul(ROOM_PER_INDEX_ENTRY))
        .saturating_add((bytes / 2).saturating_mul(ROOM_PER_TWO_BYTES))
        .saturating_add(ROOM_FIXED);
    bytes
        .saturating_add(registry)
        .saturating_add(reserve)
        .saturating_sub(landed)
}

/// Whether `cmd` adds data (refused when space is short) rather than removing it. The cluster's
/// settings (its version, its epoch floor) overwrite one fixed key each and are safety
/// actions an operator may need on a full disk (a restore raises the floor before anything
/// else), so they pass too, as does a restore's end (it removes its mark).
fn adds_data(cmd: &Command) -> bool {
    !matches!(
        cmd,
        Command::Delete { .. }
            | Command::DeregisterShards { .. }
            | Command::DeregisterShardsOf { .. }
            | Command::RemoveDatanode { .. }
            | Command::RemoveDatanodePiece { .. }
            | Command::PruneReplicas { .. }
            | Command::SetClusterVersion { .. }
            | Command::RaiseEpochFloor { .. }
            | Command::EndRestore
    )
}

impl MetaNode {
    /// Bytes free to this process on the data dir's file system, `None` if that cannot be
    /// read. One `statvfs`.
    pub fn data_dir_free_bytes(&self) -> Option<u64> {
        self.inner.cfg.free_space.of(&self.inner.cfg.data_dir).ok()
    }

    /// Logs a warning when the data dir's file system has less than twice `min_free_bytes`
    /// free: writes that add data stop at `min_free_bytes` (on the leader), and a registry
    /// rebuild or a snapshot install needs room. Called once, at open.
    pub(super) fn warn_if_short_of_space(&self) {
        let reserve = self.inner.cfg.min_free_bytes;
        match self.data_dir_free_bytes() {
            Some(free) if reserve > 0 && free < reserve.saturating_mul(2) => tracing::warn!(
                free,
                reserve,
                "the data dir's file system is nearly full: a leader refuses writes that add \
                 data below the reserve (--min-free-bytes); free space"
            ),
            _ => {}
        }
    }

    /// Notes what the last look for a voter with room to take this leader's place found
    /// (the HTTP layer's disk hand-over): a leader short of disk refuses writes that add data
    /// with [`Error::HandingOverForDisk`] while one may have room (also before the first look),
    /// with [`Error::InsufficientStorage`] once none has.
    pub fn note_room_elsewhere(&self, some_voter_has_room: bool) {
        self.inner
            .room_elsewhere
            .store(some_voter_has_room, std::sync::atomic::Ordering::Relaxed);
    }

    /// Notes what the HTTP layer's disk look found while this node leads: the other voters
    /// `short` of disk (less than their own `min_free_bytes` free), asked from `asked_at` on;
    /// a voter's alarm received since ([`MetaNode::note_voter_alarm`]) stands. Writes are
    /// refused ([`Error::QuorumShortOfDisk`]; deletes too) while the voters short of disk, with
    /// the voters down, leave no majority of the voters with room. Followers cannot refuse what
    /// the leader commits: a write that fills their disks stops them, and a cluster whose
    /// majority stopped takes nothing.
    pub fn note_voters_short_of_disk(
        &self,
        short: std::collections::BTreeSet<NodeId>,
        asked_at: Instant,
    ) {
        self.inner.voter_rooms.lock().looked(short, asked_at);
    }

    /// Forgets which voters are short of disk: this node does not lead.
    pub fn forget_voter_rooms(&self) {
        self.inner.voter_rooms.lock().clear();
    }

    /// Voter `from` says it is `short` of disk, or has room again: a voter that finds itself
    /// short tells its leader at once, so that writes stop (as
    /// [`MetaNode::note_voters_short_of_disk`] says) without waiting for the next disk look.
    /// `None` if this node does not lead or `from` is not another voter (nothing noted);
    /// otherwise whether it changed what this leader knew of `from`.
    pub fn note_voter_alarm(&self, from: NodeId, short: bool) -> Option<bool> {
        let m = self.leader_view()?;
        let voter = from != self.id()
            && m.membership_config
                .membership()
                .voter_ids()
                .any(|v| v == from);
        if !voter {
            return None;
        }
        Some(
            self.inner
                .voter_rooms
                .lock()
                .alarmed(from, short, Instant::now()),
        )
    }

    /// [`Error::QuorumShortOfDisk`] if the voters without room leave a voter set without a
    /// majority that has room. Without room: those noted short of disk
    /// ([`MetaNode::note_voters_short_of_disk`]) and, once one is, this node if `self_short`,
    /// and those this leader has not heard from within an election timeout (down: a write
    /// commits only with a majority; looked at on each write, as the disk look comes only
    /// every few seconds). Nothing to look at while no other voter is noted short.
    fn check_quorum_room(&self, self_short: bool) -> Result<()> {
        let mut short = self.inner.voter_rooms.lock().short().clone();
        // No other voter short: this node's own rules hold (a single voter, or a leader short
        // of disk that hands over, takes deletes).
        if short.is_empty() {
            return Ok(());
        }
        if self_short {
            short.insert(self.id());
        }
        let sets = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            let since_office = self.led_for(m.current_term);
            let silent = |v: NodeId| {
                let heard = Self::progress_of(&m, v).1.or(since_office);
                v != self.id() && heard.is_none_or(|d| d > self.lease())
            };
            let sets = m.membership_config.membership().get_joint_config().clone();
            short.extend(sets.iter().flatten().copied().filter(|v| silent(*v)));
            sets
        };
        let lacking = sets.iter().any(|set| {
            let room = set.iter().filter(|id| !short.contains(id)).count();
            room * 2 <= set.len()
        });
        if lacking {
            let voters: std::collections::BTreeSet<NodeId> = sets.into_iter().flatten().collect();
            return Err(Error::QuorumShortOfDisk {
                short: short.intersection(&voters).copied().collect(),
            });
        }
        Ok(())
    }

    /// [`Error::QuorumShortOfDisk`] for any write while the voters without room (this node
    /// among them if it is short) leave no majority with room; else
    /// [`Error::InsufficientStorage`] if `cmd` adds data and the data dir's file system has
    /// less than `min_free_bytes` free (read at most every [`RECHECK`]), or
    /// [`Error::HandingOverForDisk`] when another voter may have room (see
    /// [`MetaNode::note_room_elsewhere`]). A file system whose free space cannot be read
    /// refuses nothing.
    pub(super) fn check_free_space(&self, cmd: &Command) -> Result<()> {
        let reserve = self.inner.cfg.min_free_bytes;
        let free = match reserve {
            0 => u64::MAX,
            _ => {
                let mut last = self.inner.free_space.lock();
                match *last {
                    Some((at, free)) if at.elapsed() < RECHECK => free,
                    _ => {
                        let free = self.data_dir_free_bytes().unwrap_or(u64::MAX);
                        *last = Some((Instant::now(), free));
                        free
                    }
                }
            }
        };
        // Every write goes to the followers' logs and registries, deletes too: one a majority
        // has no room for stops them (a full follower stopped applying a delete).
        self.check_quorum_room(free < reserve)?;
        if !adds_data(cmd) || free >= reserve {
            return Ok(());
        }
        let alone = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            m.membership_config.membership().voter_ids().eq([self.id()])
        };
        let elsewhere = self
            .inner
            .room_elsewhere
            .load(std::sync::atomic::Ordering::Relaxed);
        if elsewhere && !alone {
            return Err(Error::HandingOverForDisk { free, reserve });
        }
        Err(Error::InsufficientStorage { free, reserve })
    }

    /// [`Error::NoRoomForSnapshot`] if, with `received` bytes of a snapshot from the leader
    /// landed so far, the data dir's file system has less than `min_free_bytes` free: the
    /// receiver stops there rather than fill the disk the log shares. Off when
    /// `min_free_bytes` is 0. One `statvfs`, quick enough to call between chunks.
    pub fn check_room_to_receive(&self, received: u64) -> Result<()> {
        self.check_room(received, |reserve| reserve)
    }

    /// [`Error::NoRoomForSnapshot`] if receiving and installing a snapshot file of `bytes`,
    /// whose import writes `records`, would leave the data dir's file system with less than
    /// `min_free_bytes` free (see `install_room`; with the records not known, zero, the room is
    /// a lower bound, and the received file is checked again with its own count); `landed`:
    /// what the file takes of the data dir's file system already (0 before it arrives).
    /// Reads the free space afresh. Also when `min_free_bytes` is 0: an install that runs out
    /// of space stops the node, which then receives the snapshot again at its next start and
    /// stops again. A file system whose free space cannot be read refuses nothing. One
    /// `statvfs`.
    pub fn check_room_for_snapshot(
        &self,
        bytes: u64,
        records: ImportRecords,
        landed: u64,
    ) -> Result<()> {
        self.check_room(bytes, |reserve| {
            install_room(bytes, records, reserve, landed)
        })
    }

    /// [`Error::NoRoomForSnapshot`] (counted) for a snapshot of `bytes` if the data dir's file
    /// system has less free than `need` says for the reserve; off when that is 0.
    fn check_room(&self, bytes: u64, need: impl FnOnce(u64) -> u64) -> Result<()> {
        let need = need(self.inner.cfg.min_free_bytes);
        if need == 0 {
            return Ok(());
        }
        let free = self.data_dir_free_bytes().unwrap_or(u64::MAX);
        if free < need {
            self.inner.sm.stats.install_refused();
            let refused = Error::NoRoomForSnapshot { bytes, free, need };
            *self.inner.room_refused.lock() = Some((Instant::now(), refused.to_string()));
            if due(
                &mut self.inner.room_warned.lock(),
                Instant::now(),
                REFUSAL_WARN_EVERY,
            ) {
                tracing::warn!(
                    "refusing a snapshot from the leader: {refused} \
                     (metaserver_snapshot_install_refusals_total counts the refusals; this is \
                     logged at most every {}s)",
                    REFUSAL_WARN_EVERY.as_secs()
                );
            } else {
                tracing::debug!("refusing a snapshot from the leader: {refused}");
            }
            return Err(refused);
        }
        Ok(())
    }
}

/// How long a snapshot refused for want of room is reported ([`MetaNode::snapshot_refused`]):
/// the leader sends one again within it while the member needs one.
const REFUSAL_REPORTED_FOR: Duration = Duration::from_secs(60);

impl MetaNode {
    /// Why this node refused the leader's snapshot for want of room, if it did in the last
    /// minute: a member that needs a snapshot and has no room for it catches up never, and
    /// says why only here and in its log.
    pub fn snapshot_refused(&self) -> Option<String> {
        let refused = self.inner.room_refused.lock();
        let (at, why) = refused.as_ref()?;
        (at.elapsed() < REFUSAL_REPORTED_FOR).then(|| why.clone())
    }
}

/// Whether something last done at `last` (never: `None`) is due again at `now`, `every`
/// apart; if so, `last` becomes `now`.
pub(super) fn due(last: &mut Option<Instant>, now: Instant, every: Duration) -> bool {
    match *last {
        Some(at) if now.saturating_duration_since(at) < every => false,
        _ => {
            *last = Some(now);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_warning_is_due_first_and_then_once_per_period() {
        let start = Instant::now();
        let every = Duration::from_secs(30);
        let mut last = None;
        assert!(due(&mut last, start, every));
        assert!(!due(&mut last, start + Duration::from_secs(1), every));
        assert!(!due(&mut last, start + Duration::from_secs(29), every));
        assert!(due(&mut last, start + every, every));
        assert!(!due(
            &mut last,
            start + every + Duration::from_secs(5),
            every
        ));
        assert_eq!(last, Some(start + every));
    }

    #[test]
    fn an_install_needs_room_for_a_copy_a_new_registry_and_the_reserve() {
        let none = ImportRecords::default();
        assert_eq!(install_room(0, none, 100, 0), ROOM_FIXED + 100);
        assert_eq!(install_room(10, none, 100, 0), 10 + 25 + ROOM_FIXED + 100);
        assert_eq!(install_room(10, none, 100, 10), 25 + ROOM_FIXED + 100);
        let records = ImportRecords {
            pairs: 1000,
            index_entries: 500,
        };
        assert_eq!(
            install_room(10, records, 100, 10),
            install_room(10, none, 100, 10) + 1000 * ROOM_PER_RECORD + 500 * ROOM_PER_INDEX_ENTRY,
            "counted records ask for more than the bytes alone"
        );
        assert_eq!(install_room(10, none, 100, 1 << 40), 0, "the file holds it");
        assert_eq!(install_room(u64::MAX / 2, none, 1, 0), u64::MAX);
        let all = ImportRecords {
            pairs: u64::MAX,
            index_entries: u64::MAX,
        };
        assert_eq!(install_room(1, all, 1, 0), u64::MAX);
    }

    /// The room asked covers what imports took (sled's files), with little to spare: snapshot
    /// bytes, its pairs, the index entries derived, and the files' size measured.
    #[test]
    fn the_room_asked_covers_measured_imports() {
        #[rustfmt::skip]
        let measured: [(&str, u64, u64, u64, u64); 8] = [
            ("3M consecutive ids", 40_359_493, 47_177, 47_100, 83_374_080),
            ("250k consecutive ids", 2_738_146, 3_933, 3_925, 8_929_280),
            ("1M ids scattered over 48 bits", 38_545_365, 1_000_151, 1_000_000, 311_095_296),
            ("250k scattered ids", 8_771_056, 250_026, 250_000, 76_034_048),
            ("1M replicas, ids in 4M", 8_366_312, 62_597, 546_618, 121_614_336),
            ("1M replicas, ids in 64M", 23_541_698, 602_966, 918_470, 266_878_976),
            ("40k replicas, ids in 1M", 723_515, 14_446, 35_062, 11_546_624),
            ("keys of up to 1 MiB (the peak)", 45_689_970, 5_081, 0, 105_041_920),
        ];
        for (what, bytes, pairs, index_entries, took) in measured {
            let records = ImportRecords {
                pairs,
                index_entries,
            };
            let registry = install_room(bytes, records, 0, 0) - bytes;
            let ratio = registry as f64 / took as f64;
            assert!((1.1..1.5).contains(&ratio), "{what}: {ratio:.2}");
        }
    }

    #[test]
    fn removals_pass_when_space_is_short() {
        assert!(adds_data(&Command::RegisterDatanode {
            id: 1,
            addr: "a:1".into()
        }));
        assert!(!adds_data(&Command::RemoveDatanode { id: 1 }));
        assert!(!adds_data(&Command::PruneReplicas {
            datanode: 1,
            epoch: 1,
            from_bucket: 0,
        }));
        assert!(!adds_data(&Command::Delete {
            key: "k".into(),
            if_revision: None
        }));
    }

    #[test]
    fn cluster_settings_pass_when_space_is_short() {
        assert!(!adds_data(&Command::SetClusterVersion { version: 4 }));
        assert!(!adds_data(&Command::RaiseEpochFloor { at_least: 1 }));
        assert!(!adds_data(&Command::EndRestore));
    }
}
