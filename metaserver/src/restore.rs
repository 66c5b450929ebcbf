//! `metaserver snapshot restore FILE`: replays a backup into an empty cluster through the admin
//! API, for a cluster that lost its data (or a copy of one elsewhere).
//!
//! The backup is verified completely and read offline (`meta_consensus::Backup`), and every key,
//! value and datanode address checked against what the cluster accepts, before anything is sent. The target must
//! be empty (no datanode, no key): a restore never merges into live data. It first claims the
//! cluster ([`claim`]: of two restores run at once, the second writes nothing), raising the
//! cluster's epoch floor above any epoch the old cluster handed out (the time in microseconds,
//! or more: see [`epoch_floor`]), so that every registration in the new cluster, also of a
//! datanode the backup does not name, gets an epoch no zombie of the old cluster sends with. Every
//! datanode is registered again with its address and a new epoch above that floor, so a
//! datanode's next request with its old epoch is fenced and it registers again, as after any
//! epoch change; then its replicas, with
//! their generations and sizes, in batches of 10,000 under that epoch. Every key is written with
//! `if_revision=0` (it must not exist yet), 32 at a time, and gets a new revision. The writes go
//! through Raft like any other: when the command returns, everything restored is durable on a
//! quorum. A request that finds no leader (an election, a member restarting) is sent again for
//! up to a minute. A restore that fails part way leaves what it wrote, and says so: empty the
//! cluster (start it on fresh data dirs) and run it again. Emptiness is checked when it starts:
//! keep datanodes from registering until it claims the cluster (from then on, with the mark
//! below, their registrations wait until it ends).
//!
//! The claim also marks the cluster as being restored (cluster version 8), naming the backup,
//! and the restore's last step, once every write is in and the cluster holds as many datanodes,
//! replicas and keys as the backup (read back from it), ends the mark: a restore cut off part
//! way leaves a cluster that says so (`GET /v1/cluster`, `metaserver health`), and a snapshot
//! built from it carries the mark, which `snapshot save` and a restore of it refuse without
//! `--partial`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use meta_consensus::{Backup, DatanodeInfo, KvEntry, RestoreOrigin, MAX_PAGE};
use meta_http::limits::MAX_SHARDS_PER_BATCH;
use meta_http::request::{validate_addr, validate_new_key, validate_value, MAX_MIN_EPOCH};
use meta_http::response::{
    DatanodeList, DatanodeRegistered, EpochFloorView, KvKeyPage, RestoreEndedView, ShardsRegistered,
};
use serde_json::{json, Value};

use crate::cli::ClientArgs;
use crate::operator::Operator;
use crate::scratch::{parent_of, ScratchDir};

/// Values of keys read from the backup at a time, at most (and [`MAX_PAGE`] keys).
const KV_PAGE_BYTES: usize = 16 << 20;
/// Key writes a restore keeps in flight: a key is one log entry, and concurrent writes share
/// the leader's WAL barriers, where one at a time paid a round trip and a barrier each.
const KEY_WRITES_IN_FLIGHT: usize = 32;

/// What a restore wrote.
#[derive(Debug, Default)]
struct Restored {
    /// How far the claim went (an older build cannot mark, or hold keys back).
    claimed: Claimed,
    datanodes: u64,
    replicas: u64,
    keys: u64,
}

/// What to do after a restore that stopped once it had sent a write (it may have taken effect).
pub const PART_WAY: &str = "the restore stopped part way and left what it wrote: start the \
     cluster on fresh data dirs and run it again (or keep what it holds: `metaserver snapshot \
     end-restore` ends the restore's mark on it)";

/// `metaserver snapshot restore FILE`. `sending` is set before its first write goes out, so that
/// a restore stopped by a signal can say whether the cluster still is as it was.
/// A backup saved while its cluster was being restored is refused unless `partial`.
pub async fn restore(
    args: ClientArgs,
    file: &Path,
    partial: bool,
    sending: Arc<AtomicBool>,
) -> Result<()> {
    let op = Operator::new(&args)?;
    // Owned here, not by a blocking thread: an interrupted restore removes it.
    let scratch = ScratchDir::new_in(&parent_of(file))?;
    let backup = open(file, scratch.path()).await?;
    match read(&backup, partial_backup).await? {
        Some(mark) if !partial => {
            bail!("{mark}; nothing was written (a restore with --partial takes it)")
        }
        Some(mark) => eprintln!("warning: {mark}; restored as asked (--partial)"),
        None => {}
    }
    check_keys(&backup).await?;
    let datanodes = read(&backup, |b| b.datanodes()).await?;
    check_addrs(&datanodes)?;
    if let Some(warning) = being_removed(&datanodes) {
        eprintln!("warning: {warning}");
    }
    let min_epoch = min_epoch(&backup).await?;
    check_empty(&op).await?;
    sending.store(true, Ordering::SeqCst);
    let replayed = replay(&op, &backup, min_epoch).await;
    let (index, replicas, keys) = (backup.index(), backup.replicas(), backup.keys());
    // Closing the scratch registry flushes and deletes files: not on the async runtime.
    tokio::task::spawn_blocking(move || drop(backup))
        .await
        .context("the backup reader stopped")?;
    let restored = replayed.and_then(|restored| {
        if restored.replicas != replicas || restored.keys != keys {
            bail!(
                "restored {} replicas and {} keys, but the backup holds {replicas} and {keys}",
                restored.replicas,
                restored.keys
            );
        }
        Ok(restored)
    });
    let restored = restored.map_err(|e| match e.is::<NothingWritten>() {
        true => e,
        false => e.context(PART_WAY),
    })?;
    // What this restore sent is the backup; the cluster must hold just that too (a datanode or
    // a client that wrote meanwhile leaves another registry), or it keeps the mark.
    let expected = (restored.datanodes, replicas, keys);
    let held = cluster_counts(&op).await.context(PART_WAY)?;
    if held != expected {
        let kept = match restored.claimed.marked {
            true => "; the cluster keeps its restore mark",
            false => "",
        };
        bail!(
            "the cluster holds {} (datanodes, replicas, keys) but the backup {}: something \
             else wrote to the cluster while it was restored (keep datanodes and clients away \
             from it until a restore ends){kept}; {PART_WAY}",
            counts(held),
            counts(expected)
        );
    }
    if restored.claimed.marked {
        end_restore(&op).await?;
    }
    crate::output::line(json!({
        "file": file.display().to_string(),
        "index": index,
        "epoch_floor": restored.claimed.floor,
        "datanodes": restored.datanodes,
        "replicas": restored.replicas,
        "keys": restored.keys,
    }))
}

/// What to tell of the backup's datanodes whose removal began and had not ended when it was
/// taken: they are restored as registered (a restore sends registrations, and no removal
/// marks), with the replicas they still held.
fn being_removed(datanodes: &[DatanodeInfo]) -> Option<String> {
    let ids: Vec<String> = datanodes
        .iter()
        .filter(|d| d.removing)
        .map(|d| d.id.to_string())
        .collect();
    let (first, rest) = ids.split_first()?;
    let named = match rest {
        [] => format!("datanode {first} was"),
        _ => format!("datanodes {} were", ids.join(", ")),
    };
    Some(format!(
        "{named} being removed when the backup was taken (a removal began and had not \
         ended): restored as registered, with the replicas still held then; remove again what \
         should go"
    ))
}

/// The smallest epoch the restored datanodes get ([`epoch_floor`]), checked before anything
/// is written: one the registry cannot take refuses the restore.
async fn min_epoch(backup: &Arc<Backup>) -> Result<u64> {
    let backup = backup.clone();
    let min_epoch = tokio::task::spawn_blocking(move || restorable(&backup))
        .await
        .context("the backup reader stopped")?;
    min_epoch.context("nothing was written")
}

/// The smallest epoch a restore of `backup` now gives its datanodes ([`epoch_floor`]), or why
/// no restore can take it: its epochs are so high that the registry takes no floor above them
/// (an operator asked for such a floor or `min_epoch`). Blocking (reads the backup).
pub(crate) fn restorable(backup: &Backup) -> Result<u64> {
    let datanodes = backup.datanodes().context("reading the backup")?;
    let floors = backup.highest_epoch_floor().context("reading the backup")?;
    let min_epoch = epoch_floor(now_micros(), &datanodes, floors);
    if min_epoch > MAX_MIN_EPOCH {
        bail!(
            "the backup holds epochs, or epoch floors, up to {}: a restore cannot give its \
             datanodes epochs above them (the registry takes epoch floors up to \
             {MAX_MIN_EPOCH})",
            min_epoch - 1
        );
    }
    Ok(min_epoch)
}

/// Sends every datanode with its replicas, then every key, of `backup`, the datanodes with
/// epochs of at least `min_epoch`.
async fn replay(op: &Operator, backup: &Arc<Backup>, min_epoch: u64) -> Result<Restored> {
    let mut restored = Restored::default();
    let datanodes = read(backup, |b| b.datanodes()).await?;
    let origin = RestoreOrigin {
        index: backup.index(),
        datanodes: datanodes.len() as u64,
        replicas: backup.replicas(),
        keys: backup.keys(),
    };
    restored.claimed = claim(op, min_epoch, &origin).await?;
    for datanode in datanodes {
        restored.replicas += restore_datanode(op, backup, &datanode, min_epoch).await?;
        restored.datanodes += 1;
    }
    restored.keys = restore_keys(op, backup, restored.claimed.holds_keys).await?;
    Ok(restored)
}

/// Opens and verifies the backup, with its scratch registry in `scratch`.
async fn open(file: &Path, scratch: &Path) -> Result<Arc<Backup>> {
    let path = file.to_path_buf();
    let scratch = scratch.to_path_buf();
    let backup = tokio::task::spawn_blocking(move || Backup::open(&path, &scratch))
        .await
        .context("the backup reader stopped")?
        .with_context(|| format!("{} is not a usable backup", file.display()))?;
    Ok(Arc::new(backup))
}

/// Runs a read of the backup off the async runtime.
async fn read<T: Send + 'static>(
    backup: &Arc<Backup>,
    f: impl FnOnce(&Backup) -> meta_consensus::Result<T> + Send + 'static,
) -> Result<T> {
    let backup = backup.clone();
    tokio::task::spawn_blocking(move || f(&backup))
        .await
        .context("the backup reader stopped")?
        .context("reading the backup")
}

/// Fails, before anything is sent, if a key or value of the backup is one the cluster would
/// refuse (a backup from an older version may hold keys that new writes may not use).
async fn check_keys(backup: &Arc<Backup>) -> Result<()> {
    let mut pages = KvPages::default();
    while let Some(entries) = pages.next(backup).await? {
        for entry in &entries {
            if let Err(e) = validate_new_key(&entry.key).and(validate_value(&entry.value)) {
                bail!(
                    "the backup's key {:?} cannot be restored: {e}; nothing was sent",
                    entry.key
                );
            }
        }
    }
    Ok(())
}

/// Fails, before anything is sent, if a datanode's address is one the cluster would refuse (an
/// older version accepted addresses that are not `host:port`): a restore refused part way would
/// be refused at the same datanode every time it ran again.
fn check_addrs(datanodes: &[DatanodeInfo]) -> Result<()> {
    for datanode in datanodes {
        if let Err(e) = validate_addr(&datanode.addr) {
            bail!(
                "the backup's datanode {} cannot be restored: {e}; nothing was sent",
                datanode.id
            );
        }
    }
    Ok(())
}

/// The backup's keys with their values, a page at a time, in key order.
#[derive(Default)]
struct KvPages {
    after: Option<String>,
    done: bool,
}

impl KvPages {
    /// The next page, or `None` after the last.
    async fn next(&mut self, backup: &Arc<Backup>) -> Result<Option<Vec<KvEntry>>> {
        if self.done {
            return Ok(None);
        }
        let cursor = self.after.take();
        let page = read(backup, move |b| {
            b.kv_entries(cursor.as_deref(), MAX_PAGE, KV_PAGE_BYTES)
        })
        .await?;
        self.done = page.next.is_none();
        self.after = page.next;
        Ok(Some(page.items))
    }
}

/// Fails unless the cluster holds no datanode and no key.
async fn check_empty(op: &Operator) -> Result<()> {
    // Asked again while the cluster elects a leader or a member restarts, as the writes are.
    let datanodes: DatanodeList = op.get_json_retrying("/v1/datanodes?limit=1").await?;
    let keys: KvKeyPage = op.get_json_retrying("/v1/kv?limit=1").await?;
    if !datanodes.datanodes.is_empty() || !keys.keys.is_empty() {
        let holds = match (datanodes.datanodes.is_empty(), keys.keys.is_empty()) {
            (false, false) => "datanodes and keys",
            (false, true) => "datanodes",
            _ => "keys",
        };
        bail!(
            "the cluster is not empty (it holds {holds}): a restore only goes into an empty \
             cluster; nothing was written"
        );
    }
    Ok(())
}

/// The restored cluster's epoch floor, and the smallest epoch a restored datanode gets: the
/// time now (`now_micros`, microseconds since 1970), and more than every epoch in the backup
/// (its datanodes' epochs, and `floors`, the highest epoch floor it keeps). Epochs are log
/// indexes, raised past older epochs of the same datanode; a cluster appends far fewer than a
/// million entries a second, so every epoch the old cluster (or an earlier restore) handed out
/// since the backup is below the time, unless a registration asked for a higher floor, which
/// the backup's epochs then show. A batch a datanode sends under an old epoch is fenced (it
/// must register again) instead of landing on the restored registry.
fn epoch_floor(now_micros: u64, datanodes: &[DatanodeInfo], floors: u64) -> u64 {
    datanodes
        .iter()
        .map(|d| d.epoch.saturating_add(1))
        .fold(now_micros.max(floors.saturating_add(1)), u64::max)
}

/// Raises the cluster's epoch floor to `floor`: every registration from now on, also of a
/// datanode the backup does not name, gets an epoch of at least that. Answers the floor, or
/// `None`, with a warning, when the cluster cannot keep one: a member runs a build older than
/// version 4 (refused at once), or did not answer for the minute a refusal is sent again (a
/// member still starting answers within it). The restore then goes on, and the backup's
/// datanodes still get epochs above `floor`.
async fn raise_epoch_floor(op: &Operator, floor: u64) -> Result<Option<u64>> {
    let body = json!({ "at_least": floor });
    let answer = op
        .answer_retrying(|| {
            op.request(reqwest::Method::PUT, "/v1/cluster/epoch-floor")
                .json(&body)
        })
        .await?;
    match answer {
        Ok(r) => {
            let raised: EpochFloorView = r
                .json()
                .await
                .context("decoding the answer to the epoch floor's raise")?;
            Ok(Some(raised.epoch_floor))
        }
        Err(refused)
            if refused.code() == Some("cluster_version")
                || refused.status == reqwest::StatusCode::NOT_FOUND =>
        {
            eprintln!(
                "warning: {}; the restored datanodes get epochs above every epoch of the \
                 backup, but a datanode it does not name registers with a low epoch: keep the \
                 old cluster's datanodes that the backup does not name away until they restart",
                op.refused_error(refused)
            );
            Ok(None)
        }
        Err(refused) => Err(op
            .refused_error(refused)
            .context("raising the cluster's epoch floor")),
    }
}

/// A restore refused before it wrote anything: the cluster is as it was.
#[derive(Debug)]
struct NothingWritten(String);

impl std::fmt::Display for NothingWritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; nothing was written", self.0)
    }
}

impl std::error::Error for NothingWritten {}

/// How far a restore's claim went ([`claim`]): what the members' builds allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Claimed {
    /// The cluster's epoch floor, if the restore raised it (`None`: an older build could not).
    floor: Option<u64>,
    /// The cluster is marked as being restored until [`end_restore`] (cluster version 8).
    marked: bool,
    /// Keys are held back until then: every key write is refused but the restore's own
    /// (`restore=true`), which it must then send (cluster version 9).
    holds_keys: bool,
}

/// Claims the cluster for this restore: raises its epoch floor to `floor` only if it is fresh
/// (no datanode, no key, a floor never raised), in one log entry, so that of two restores run
/// into one cluster at once the second is refused ([`NothingWritten`]) before it writes
/// anything; the emptiness check before it passes both. The claim marks the cluster as being
/// restored from `origin` until [`end_restore`], and holds its keys back until then. A claim
/// refused after an attempt whose answer was lost may be this restore's own: the cluster's floor
/// then is `floor` (a time in microseconds no other restore picks). A cluster whose members do
/// not all run a build that holds keys back (cluster version 9) is claimed with a mark only, one
/// whose members do not all run a build that marks (version 8) without a mark, and one whose
/// members do not all run a build that claims (version 6) is not claimed: the floor is raised as
/// before; each with a warning, before anything is written.
async fn claim(op: &Operator, floor: u64, origin: &RestoreOrigin) -> Result<Claimed> {
    let mut marked = json!({
        "at_least": floor,
        "if_fresh": true,
        "restore": {
            "index": origin.index,
            "datanodes": origin.datanodes,
            "replicas": origin.replicas,
            "keys": origin.keys,
        },
    });
    let mut held = marked.clone();
    held["hold_keys"] = json!(true);
    let taken = |floor, marked, holds_keys| Claimed {
        floor: Some(floor),
        marked,
        holds_keys,
    };
    match claim_with(op, floor, &held, &["hold_keys", "restore", "if_fresh"]).await? {
        Claim::Took(floor) => return Ok(taken(floor, true, true)),
        Claim::Older(why) => eprintln!(
            "warning: the cluster cannot hold its keys back while the restore runs, as not \
             every member is known to run a build of cluster version 9 or later (the cluster said: \
             {why}); the restore goes on without it: a key that a client writes meanwhile is not refused, and fails the restore (or, \
             overwriting a restored key, goes unseen): keep clients away until it ends"
        ),
    }
    match claim_with(op, floor, &marked, &["restore", "if_fresh"]).await? {
        Claim::Took(floor) => return Ok(taken(floor, true, false)),
        Claim::Older(why) => eprintln!(
            "warning: the cluster cannot be marked as being restored, as not every member is \
             known to run a build of cluster version 8 or later (the cluster said: {why}); the \
             restore goes on without it: if it stops before it ends, the cluster will not say so"
        ),
    }
    marked.as_object_mut().expect("an object").remove("restore");
    match claim_with(op, floor, &marked, &["if_fresh"]).await? {
        Claim::Took(floor) => Ok(taken(floor, false, false)),
        Claim::Older(why) => {
            eprintln!(
                "warning: the cluster cannot be claimed for the restore, as not every member is \
                 known to run a build of cluster version 6 or later (the cluster said: {why}); the \
                 restore goes on without it: a restore run into it at the same time would not \
                 be refused"
            );
            Ok(Claimed {
                floor: raise_epoch_floor(op, floor).await?,
                ..Claimed::default()
            })
        }
    }
}

/// How a claim went.
enum Claim {
    /// The cluster's epoch floor is now this.
    Took(u64),
    /// The leader's build, or the cluster's version, does not take the claim as sent: what it
    /// said. Nothing was written.
    Older(String),
}

/// Sends the claim `body` ([`claim`]); `fields` are the body's fields that an older build may not
/// know, one of which it names when it refuses the body.
async fn claim_with(op: &Operator, floor: u64, body: &Value, fields: &[&str]) -> Result<Claim> {
    let answer = op
        .answer_retrying(|| {
            op.request(reqwest::Method::PUT, "/v1/cluster/epoch-floor")
                .json(body)
        })
        .await?;
    let refused = match answer {
        Ok(r) => {
            let claimed: EpochFloorView = r
                .json()
                .await
                .context("decoding the answer to the cluster's claim")?;
            return Ok(Claim::Took(claimed.epoch_floor));
        }
        Err(refused) => refused,
    };
    if refused.status == reqwest::StatusCode::CONFLICT {
        if own_claim(refused.message(), floor) {
            return Ok(Claim::Took(floor));
        }
        return Err(NothingWritten(op.refused_error(refused).to_string()).into());
    }
    // A build that does not take the claim: it does not know the field, or the cluster's
    // version is older.
    let older = refused.code() == Some("cluster_version")
        || (refused.code() == Some("invalid_body")
            && fields.iter().any(|field| {
                refused
                    .message()
                    .contains(&format!("unknown field `{field}`"))
            }));
    if !older {
        // A refusal (a wrong token, a full disk) wrote nothing; another answer may follow an
        // attempt whose outcome is unknown.
        let status = refused.status;
        let error = op.refused_error(refused);
        if status.is_client_error() || status == reqwest::StatusCode::INSUFFICIENT_STORAGE {
            return Err(
                NothingWritten(format!("claiming the cluster for the restore: {error}")).into(),
            );
        }
        return Err(error.context("claiming the cluster for the restore"));
    }
    Ok(Claim::Older(refused.message().to_owned()))
}

/// Ends the restore's mark on the cluster ([`claim`]): everything it replays is written. A
/// cluster whose mark cannot be removed holds the whole backup, and still says it is being
/// restored: the error says how to end the mark by hand.
async fn end_restore(op: &Operator) -> Result<()> {
    let ended = async {
        let ended = send_end(op).await?;
        if ended.ended.is_none() {
            eprintln!(
                "warning: the cluster's restore mark was gone when this restore came to end it: \
                 it was ended by hand (`snapshot end-restore`, DELETE /v1/cluster/restore) while \
                 the restore ran, or by an earlier attempt of this end whose answer was lost"
            );
        }
        anyhow::Ok(())
    };
    ended.await.context(
        "the restore wrote the whole backup, but the cluster's mark that it is being restored \
         could not be removed: remove it with `metaserver snapshot end-restore`",
    )
}

/// `metaserver snapshot end-restore`: ends the restore the cluster's mark names, keeping what
/// the cluster holds, and prints the mark removed (`{"ended":null}`: there was none).
pub async fn end_restore_command(args: ClientArgs) -> Result<()> {
    let ended = send_end(&Operator::new(&args)?).await?;
    crate::output::line(serde_json::to_string(&ended)?)
}

/// Ends the cluster's restore mark (`DELETE /v1/cluster/restore`): the mark it removed.
async fn send_end(op: &Operator) -> Result<RestoreEndedView> {
    op.send_retrying(|| op.request(reqwest::Method::DELETE, "/v1/cluster/restore"))
        .await?
        .json()
        .await
        .context("decoding the answer to the restore's end")
}

/// What the cluster holds, with linearizable reads: its datanodes, their replicas and its
/// keys.
async fn cluster_counts(op: &Operator) -> Result<(u64, u64, u64)> {
    let (mut datanodes, mut replicas, mut keys) = (0u64, 0u64, 0u64);
    let mut after = String::new();
    loop {
        let path = format!("/v1/datanodes?limit={MAX_PAGE}{after}");
        let page: DatanodeList = op.get_json_retrying(&path).await?;
        datanodes += page.datanodes.len() as u64;
        replicas += page.datanodes.iter().map(|d| d.shards).sum::<u64>();
        match page.next {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    let mut after = String::new();
    loop {
        let path = format!("/v1/kv?limit={MAX_PAGE}{after}");
        let page: KvKeyPage = op.get_json_retrying(&path).await?;
        keys += page.keys.len() as u64;
        match page.next {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    Ok((datanodes, replicas, keys))
}

/// Counts of datanodes, replicas and keys, in words.
fn counts((datanodes, replicas, keys): (u64, u64, u64)) -> String {
    format!("{datanodes}, {replicas}, {keys}")
}

/// What to say of a backup saved while its cluster was being restored (it holds the
/// restore's mark), `None` for any other. Blocking (reads the backup).
pub(crate) fn partial_backup(backup: &Backup) -> meta_consensus::Result<Option<String>> {
    let Some(mark) = backup.restore_mark()? else {
        return Ok(None);
    };
    let o = mark.origin;
    Ok(Some(format!(
        "the snapshot was built while a restore into its cluster had not ended (claimed at \
         index {}, replaying a backup of index {}: datanodes {}, replicas {}, keys {}; under \
         way, or cut off part way): it may hold part of that backup only",
        mark.claimed_at, o.index, o.datanodes, o.replicas, o.keys
    )))
}

/// Whether a claim's refusal, `message`, names a cluster that holds nothing but the floor
/// `floor`: the claim of this restore's own earlier attempt (the leader that refused names what
/// the cluster holds; a member's status could lag behind it).
fn own_claim(message: &str, floor: u64) -> bool {
    message.contains(&format!("it holds an epoch floor raised to {floor} ("))
}

/// The time now in microseconds since 1970.
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Registers `datanode` (epoch at least `min_epoch`) and its replicas; returns how many
/// replicas were accepted.
async fn restore_datanode(
    op: &Operator,
    backup: &Arc<Backup>,
    datanode: &DatanodeInfo,
    min_epoch: u64,
) -> Result<u64> {
    let id = datanode.id;
    // Registering again (a retry after a lost answer) only starts a newer epoch.
    let body = json!({ "addr": datanode.addr, "min_epoch": min_epoch });
    let registered: DatanodeRegistered = op
        .send_retrying(|| {
            op.request(reqwest::Method::PUT, &format!("/v1/datanodes/{id}"))
                .json(&body)
        })
        .await?
        .json()
        .await
        .context("decoding the registration answer")?;
    let mut accepted = 0;
    let mut after: Option<String> = None;
    loop {
        let cursor = after.clone();
        let page = read(backup, move |b| {
            b.datanode_shards(id, cursor.as_deref(), MAX_PAGE.min(MAX_SHARDS_PER_BATCH))
        })
        .await?;
        if !page.items.is_empty() {
            let shards: Vec<Value> = page
                .items
                .iter()
                .map(|s| json!({"id": s.shard, "generation": s.generation, "size": s.size}))
                .collect();
            let body = json!({ "epoch": registered.epoch, "shards": shards });
            let answer: ShardsRegistered = op
                .send_retrying(|| {
                    op.request(reqwest::Method::POST, &format!("/v1/datanodes/{id}/shards"))
                        .json(&body)
                })
                .await?
                .json()
                .await
                .context("decoding the registration answer")?;
            // Unchanged: a retried batch whose first try was applied (the cluster was empty).
            let landed = answer.accepted + answer.unchanged;
            if landed != shards.len() as u64 {
                bail!(
                    "datanode {id}: {} of {} replicas accepted ({} unchanged, stale {:?})",
                    answer.accepted,
                    shards.len(),
                    answer.unchanged,
                    answer.stale
                );
            }
            accepted += landed;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(accepted),
        }
    }
}

/// Writes every key of the backup (it must not exist yet), [`KEY_WRITES_IN_FLIGHT`] at a time,
/// as the restore's own (`restore=true`) if its claim `holds_keys` back; returns how many.
async fn restore_keys(op: &Operator, backup: &Arc<Backup>, holds_keys: bool) -> Result<u64> {
    let mut written = 0;
    let mut pages = KvPages::default();
    while let Some(entries) = pages.next(backup).await? {
        let mut puts = futures::stream::iter(entries)
            .map(|entry| async move { restore_key(op, &entry, holds_keys).await })
            .buffer_unordered(KEY_WRITES_IN_FLIGHT);
        while let Some(put) = puts.next().await {
            put?;
            written += 1;
        }
    }
    Ok(written)
}

/// Writes one key of the backup (it must not exist yet), as the restore's own if `holds_keys`.
async fn restore_key(op: &Operator, entry: &KvEntry, holds_keys: bool) -> Result<()> {
    let path = match holds_keys {
        true => format!("{}?if_revision=0&restore=true", kv_path(&entry.key)),
        false => format!("{}?if_revision=0", kv_path(&entry.key)),
    };
    let put = op
        .send_retrying(|| {
            op.request(reqwest::Method::PUT, &path)
                .body(entry.value.clone())
        })
        .await;
    let Err(e) = put else {
        return Ok(());
    };
    // A retry whose first try was applied finds the key written: with our value, that is the
    // write done.
    let stored = op
        .send(|| op.request(reqwest::Method::GET, &kv_path(&entry.key)))
        .await;
    let ours = match stored {
        Ok(r) => r.bytes().await.is_ok_and(|b| b[..] == entry.value[..]),
        Err(_) => false,
    };
    if ours {
        Ok(())
    } else {
        Err(e.context(format!("writing key {:?}", entry.key)))
    }
}

/// The path of `key` under `/v1/kv/`, each of its `/`-separated segments percent-encoded
/// (`check_keys` refused `.` and `..` segments, which the URL would drop).
fn kv_path(key: &str) -> String {
    let mut url = reqwest::Url::parse("http://localhost/v1/kv").expect("a valid URL");
    url.path_segments_mut()
        .expect("an http URL has a path")
        .extend(key.split('/'));
    url.path().to_owned()
}

#[cfg(test)]
mod tests;
