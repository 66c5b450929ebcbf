//! What a node checks and repairs of its log, registry and snapshots before Raft starts, where
//! openraft would refuse (or panic at) the state it finds: a registry ahead of its log, the
//! only voter's lost vote, a log that lost its oldest segment (and with it, maybe, its vote),
//! a newest snapshot behind the log's purge point.

use meta_store::WalOptions;

use crate::config::NodeConfig;
use crate::error::{Error, Result};
use crate::front_gap::FrontGap;
use crate::log_store::LogStore;
use crate::rebuild_source::RebuildSource;
use crate::registry_ahead::{RegistryAhead, Remedy};
use crate::sole_voter;
use crate::state_machine::StateMachine;

/// What [`repair`] does once the log and registry are open.
pub(super) enum Repair {
    /// Keep the registry, ahead of the log, as a snapshot (`registry_ahead.rs`).
    KeepRegistry(RegistryAhead),
    /// Purge the log over its lost oldest entries (`front_gap.rs`).
    CloseFrontGap(FrontGap),
}

/// Opens the log and the registry, and judges a registry ahead of its log
/// (`registry_ahead.rs`), the only voter's vote (`sole_voter.rs`), a registry behind the log's
/// purge point (`rebuild_source.rs`) and a log that lost its oldest entries (`front_gap.rs`).
/// Returns what [`repair`] is to do, if anything. Blocking.
pub(super) fn open_log_and_registry(
    c: &NodeConfig,
    wal_opts: WalOptions,
) -> Result<(LogStore, StateMachine, Option<Repair>)> {
    let log = match &c.wal_fs {
        Some(fs) => LogStore::open_with(fs.clone(), &c.wal_dir(), wal_opts)?,
        None => LogStore::open(&c.wal_dir(), wal_opts)?,
    };
    // Judged with the restored vote; written only once the start is not refused.
    let restored = log.restore_lost_vote();
    let limiter = c.snapshot_pace.limiter();
    limiter.set_rate(c.snapshot_max_bytes_per_sec);
    let purged = log.last_purged().map(|l| l.index);
    let open_sm = || {
        StateMachine::open(
            purged,
            &c.registry_dir(),
            &c.snapshot_dir(),
            c.sled_cache_bytes,
            c.snapshots_to_keep,
            limiter.clone(),
        )
    };
    let mut sm = open_sm()?;
    let mut repair = None;
    if let Some(ahead) = RegistryAhead::of(&sm, &log) {
        match ahead.remedy(&sm, c.id) {
            Remedy::Keep => repair = Some(Repair::KeepRegistry(ahead)),
            Remedy::Rebuild => {
                tracing::warn!(
                    applied = ahead.applied.index,
                    held = ahead.held,
                    "the registry applied entries that neither the log nor a snapshot holds (the \
                     log lost records the registry had applied: a power loss, or a log file cut \
                     short or removed): rebuilding it from the newest snapshot and the log, \
                     which the leader completes"
                );
                sm.shared().registry.rebuild_next();
                drop(sm);
                sm = open_sm()?;
            }
        }
    }
    sole_voter::check_vote(&sm, &log, &c.wal_dir(), c.id)?;
    // A registry behind the log's purge point (deleted, say) is completed from the newest
    // snapshot by openraft: without one that reaches the purge point and reads back whole,
    // say so.
    let current = sm.shared().current_snapshot();
    let source = RebuildSource {
        purged,
        snapshot: sm.shared().last_snapshot().map(|s| s.index),
        snapshot_file: current.map(|(_, data)| data.path().to_path_buf()),
        set_aside: sm.shared().set_aside.clone(),
    };
    let applied = sm.shared().applied().0.map_or(0, |l| l.index);
    source.check_behind(&c.registry_dir(), applied)?;
    if repair.is_none() {
        // A registry kept as a snapshot purges the log past any lost front.
        repair = FrontGap::of(&sm, &log, &c.wal_dir())?.map(Repair::CloseFrontGap);
    }
    if let Some(vote) = restored {
        log.persist_vote(vote)?;
        tracing::warn!(
            %vote,
            "the log holds entries but no vote (the segment that held it was lost): restored \
             the vote its newest entry was taken under"
        );
    }
    Ok((log, sm, repair))
}

/// Does what [`open_log_and_registry`] found needed, or else replaces a snapshot behind the
/// log's purge point (either repair leaves the log purged up to the newest snapshot). Before
/// Raft starts.
pub(super) async fn repair(
    repair: Option<Repair>,
    sm: &mut StateMachine,
    log: &LogStore,
) -> Result<()> {
    match repair {
        Some(Repair::KeepRegistry(ahead)) => ahead.keep(sm, log).await,
        Some(Repair::CloseFrontGap(gap)) => gap.close(sm, log).await,
        None => replace_snapshot_behind_purge(sm, log).await,
    }
}

/// Builds a snapshot of the registry before Raft starts when the newest snapshot ends before
/// the log's purge point (a newer snapshot file was lost or deleted): openraft refuses to start
/// from that state (a debug build panics; a release one sent the older snapshot, which leaves a
/// member behind the purge point, again and again in a tight loop). The registry reaches the
/// purge point (`RebuildSource::check_behind` refused the start otherwise).
async fn replace_snapshot_behind_purge(sm: &mut StateMachine, log: &LogStore) -> Result<()> {
    let Some(purged) = log.last_purged() else {
        return Ok(());
    };
    let snapshot = sm.shared().last_snapshot().map(|s| s.index);
    if snapshot.is_some_and(|s| s >= purged.index) {
        return Ok(());
    }
    tracing::warn!(
        purged = purged.index,
        snapshot,
        "the newest snapshot ends before the log's purge point (a newer snapshot file was lost): \
         building one from the registry"
    );
    let built = sm
        .snapshot_before_raft("to replace one behind the purge point")
        .await?;
    if built.is_none_or(|b| b.index < purged.index) {
        return Err(Error::Raft(format!(
            "a snapshot built to replace one behind the log's purge point {purged} ends at \
             {built:?}"
        )));
    }
    Ok(())
}
