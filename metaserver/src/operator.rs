//! Operator commands over the admin API: `status`, `shards`, `register`, `watch` and
//! `snapshot save` (`snapshot restore` is in `restore.rs`, `member` in `membership.rs`,
//! `health` in `health.rs`).
//! Any member will do: writes sent to a follower are forwarded to the leader.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use meta_http::limits::MAX_SHARDS_PER_BATCH;
use meta_http::request::ShardBody;
use meta_http::response::{
    ClusterView, DatanodeView, LivenessView, ShardPage, ShardsDeregistered, ShardsRegistered,
    WatchPage,
};
use serde::Deserialize;
use serde_json::Value;

use crate::cli::{ClientArgs, RegisterArgs, ShardsArgs, WatchArgs};
use crate::output;

mod client;
mod health;
mod members;
mod membership;
mod notices;

pub(crate) use client::{plain_http_hint, Operator};
pub(crate) use health::health;
pub(crate) use membership::member;

/// The shards file: a bare list, or a batch with its epoch.
#[derive(Debug)]
enum ShardsFile {
    List(Vec<ShardBody>),
    Batch(BatchFile),
}

/// The batch form of the shards file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchFile {
    epoch: u64,
    shards: Vec<ShardBody>,
}

impl ShardsFile {
    /// Reads `text`, told apart by its first character, so that an error names what is wrong
    /// where (a missing or unknown field, with its line and column).
    fn parse(text: &str) -> Result<ShardsFile> {
        match text.trim_start().chars().next() {
            Some('[') => Ok(ShardsFile::List(serde_json::from_str(text)?)),
            Some('{') => Ok(ShardsFile::Batch(serde_json::from_str(text)?)),
            _ => bail!("the file holds no JSON list or object"),
        }
    }
}

/// The first shard id that `shards` lists again, with the position (from 1) where it comes
/// again. The server refuses such a batch, but a file split into several batches would have
/// the later entry overwrite the earlier one.
fn listed_twice(shards: &[ShardBody]) -> Option<(u64, usize)> {
    let mut seen = std::collections::HashSet::with_capacity(shards.len());
    shards
        .iter()
        .position(|s| !seen.insert(s.id))
        .map(|i| (shards[i].id, i + 1))
}

/// `metaserver status`: the member's view, as pretty JSON: of the first member given that
/// answers, was not removed from the cluster (a removed member's view is of the cluster it
/// left) and knows a leader (one in no cluster yet, or cut off, tells little of the cluster),
/// or of the last one asked if none does.
pub async fn status(args: ClientArgs) -> Result<()> {
    let op = Operator::new(&args)?;
    let mut view: ClusterView = op.get_json("/v1/cluster").await?;
    for _ in 1..op.members() {
        // The member that answered (a request moves on from one that cannot).
        let answered = op.member().to_owned();
        let telling = view.role != "removed" && view.leader_id.is_some();
        if telling || op.next_member(&answered) {
            break;
        }
        view = op.get_json("/v1/cluster").await?;
    }
    output::line(serde_json::to_string_pretty(&view)?)
}

/// `metaserver liveness`: the leader's liveness report, as pretty JSON.
pub async fn liveness(args: ClientArgs) -> Result<()> {
    let report = liveness_report(&Operator::new(&args)?).await?;
    output::line(serde_json::to_string_pretty(&report)?)
}

/// Every page of the liveness report as one (with the leader's figures of its last page).
async fn liveness_report(op: &Operator) -> Result<LivenessView> {
    let mut report: LivenessView = op.get_json("/v1/liveness?limit=10000").await?;
    while let Some(after) = report.next.take() {
        let page: LivenessView = op
            .get_json(&format!("/v1/liveness?limit=10000&after={after}"))
            .await?;
        report = LivenessView {
            datanodes: [report.datanodes, page.datanodes].concat(),
            ..page
        };
    }
    Ok(report)
}

/// `metaserver shards [--datanode N]`: every replica, one JSON object per line.
pub async fn shards(args: ShardsArgs) -> Result<()> {
    let op = Operator::new(&args.client)?;
    let path = match args.datanode {
        Some(id) => format!("/v1/datanodes/{id}/shards"),
        None => "/v1/shards".to_owned(),
    };
    let mut after: Option<String> = None;
    loop {
        let url = match &after {
            Some(cursor) => format!("{path}?limit=10000&after={cursor}"),
            None => format!("{path}?limit=10000"),
        };
        let page: ShardPage = op.get_json(&url).await?;
        output::json_lines(&page.shards)?;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(())
}

/// How long `watch` waits before asking again after the member could not answer (no leader, a
/// restart under way).
const WATCH_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// How long the first request of a watch (the index to start from, answered at once by a
/// member that can) may take: changes made while a member that stopped answering (a paused
/// process) holds it would come before the start, and never be printed.
const WATCH_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `watch` is asking again after failures, so that it says so on stderr once when it
/// starts and once when a member answers again, not silently nor once a second.
#[derive(Default)]
struct Outage {
    since: Option<std::time::Instant>,
}

impl Outage {
    fn note(&mut self, member: &str, why: &str) {
        if self.since.is_none() {
            eprintln!("watch: {member} cannot answer ({why}); asking again every second");
            self.since = Some(std::time::Instant::now());
        }
    }

    fn recovered(&mut self, member: &str) {
        if let Some(since) = self.since.take() {
            eprintln!(
                "watch: {member} answers (after {:.1} s)",
                since.elapsed().as_secs_f64()
            );
        }
    }
}

/// `metaserver watch [--after N [--history H]] [--datanode N | --prefix P] [--once]`: every
/// change after the index (or from now), one JSON event per line with the history its index
/// counts in, until interrupted. It rides out a member that
/// cannot answer for a while (503, a refused connection) by asking the next member given, or
/// the same again, every second (every member counts the same indexes); a member whose
/// history no longer holds its index (410 `compacted`: it restarted since) sends it to the next
/// member given, and once every one of them refused the index that ends it with an error, as do
/// an address no request can be made to and a lone member that says waiting does not help.
pub async fn watch(args: WatchArgs) -> Result<()> {
    let op = Operator::new(&args.client)?;
    let mut filter: Vec<(&str, String)> = Vec::new();
    if let Some(id) = args.datanode {
        filter.push(("datanode", id.to_string()));
    }
    if let Some(prefix) = &args.prefix {
        filter.push(("prefix", prefix.clone()));
    }
    // Without --after, the first answer is the index to start from.
    let mut after = args.after;
    // The history the indexes count in, given back with each request: a cluster restored from
    // a backup counts again, and its member refuses an index of the old one (410) rather than
    // answer from it, which would skip changes.
    let mut history: Option<String> = args.history.clone();
    let mut retrying = Outage::default();
    let mut handshakes_failed = 0;
    // The members that answered 410 `compacted` for the index asked now.
    let mut compacted_by: Vec<String> = Vec::new();
    loop {
        let asked = op.member().to_owned();
        // A member that refused the index keeps refusing it: the others are asked (one that
        // could not answer, again every second) until one answers or every one refused.
        if compacted_by.contains(&asked) {
            if op.next_member(&asked) {
                tokio::time::sleep(WATCH_RETRY).await;
            }
            continue;
        }
        let mut request = op.request(reqwest::Method::GET, "/v1/watch").query(&filter);
        match after {
            Some(after) => request = request.query(&[("after", after.to_string())]),
            None => request = request.timeout(WATCH_START_TIMEOUT),
        }
        if let Some(history) = &history {
            request = request.query(&[("history", history)]);
        }
        // A long poll may wait long for its answer: a reader that went away meanwhile ends the
        // watch then, not at the next change.
        let sent = tokio::select! {
            sent = request.send() => sent,
            gone = output::until_reader_gone() => return Err(gone),
        };
        let all_failed = op.handshakes_all_failed(&mut handshakes_failed, sent.as_ref().err());
        let page: WatchPage = match sent {
            Ok(r) if r.status().is_success() => {
                r.json().await.context("decoding a watch answer")?
            }
            // A member keeps the changes since it started only: one restarted after the index
            // answers 410 `compacted` while another may still hold them. Each member given is
            // asked once for the index; the last one's refusal ends the watch.
            Ok(r) if r.status() == reqwest::StatusCode::GONE => {
                let refused = client::Refused::read(r).await;
                if refused.code() != Some("compacted") {
                    return Err(op.refused_error(refused));
                }
                compacted_by.push(asked.clone());
                if compacted_by.len() >= op.members() {
                    return Err(op.refused_error(refused));
                }
                op.next_member(&asked);
                continue;
            }
            // No leader, a leader that did not answer in time, a node stopping or
            // restarting: ask again.
            Ok(r)
                if ![
                    reqwest::StatusCode::SERVICE_UNAVAILABLE,
                    reqwest::StatusCode::GATEWAY_TIMEOUT,
                ]
                .contains(&r.status()) =>
            {
                return Err(op.refusal(r).await)
            }
            // A request that cannot be made at all (a bad address or scheme) never will be.
            // Nor will one once every member given failed its TLS handshake.
            Err(e) if e.is_builder() || all_failed => {
                return Err(anyhow::Error::new(e).context("watching"));
            }
            // A 503 without `Retry-After` says waiting does not help (the member was removed
            // from its cluster, or its voters refuse it): with no other member to ask, stop.
            Ok(r)
                if op.one_member()
                    && r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE
                    && !r.headers().contains_key(reqwest::header::RETRY_AFTER) =>
            {
                return Err(op.refusal(r).await)
            }
            Ok(r) => {
                let status = r.status();
                let refused = client::Refused::read(r).await;
                retrying.note(&asked, &format!("{status}: {}", refused.message()));
                if op.next_member(&asked) {
                    tokio::time::sleep(WATCH_RETRY).await;
                }
                continue;
            }
            Err(e) => {
                // With its causes: "error sending request" alone does not say what failed.
                retrying.note(&asked, &format!("{:#}", anyhow::Error::new(e)));
                if op.next_member(&asked) {
                    tokio::time::sleep(WATCH_RETRY).await;
                }
                continue;
            }
        };
        retrying.recovered(&asked);
        compacted_by.clear();
        if page.history.is_some() {
            history = page.history;
        }
        // Each event with the history its index counts in: what a script that resumes later
        // gives back (`--after INDEX --history HISTORY`).
        let printed: Vec<PrintedEvent> = page
            .events
            .iter()
            .map(|event| PrintedEvent {
                event,
                history: history.as_deref(),
            })
            .collect();
        output::json_lines(&printed)?;
        let started = after.is_some();
        after = Some(page.index);
        if args.once && started && !page.events.is_empty() {
            return Ok(());
        }
    }
}

/// A change as `watch` prints it: the event, and the history its index counts in.
#[derive(serde::Serialize)]
struct PrintedEvent<'a> {
    #[serde(flatten)]
    event: &'a meta_http::response::EventView,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<&'a str>,
}

/// `metaserver register --datanode N --file shards.json`: registers the shards in batches of
/// at most 10,000 under the datanode's current epoch (or the file's); with `--prune`, then
/// drops the datanode's replicas that no batch of that epoch registered. Every request rides
/// out a leader change or a cluster without a leader for a while
/// ([`Operator::send_retrying`]): each applies once (a batch sent again is `unchanged`, a
/// prune sent again finds nothing more to drop, and then counts none).
pub async fn register(args: RegisterArgs) -> Result<()> {
    let op = Operator::new(&args.client)?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    // With --prune, an empty file says the datanode holds nothing (`find ... > file`).
    let parsed = if args.prune && text.trim().is_empty() {
        ShardsFile::List(Vec::new())
    } else {
        ShardsFile::parse(&text).with_context(|| {
            format!(
                "{} is not a list of {{\"id\",\"generation\",\"size\"}} nor {{\"epoch\",\"shards\"}}",
                args.file.display()
            )
        })?
    };
    let (epoch, shards) = match parsed {
        ShardsFile::Batch(BatchFile { epoch, shards }) => (epoch, shards),
        ShardsFile::List(shards) => {
            let id = args.datanode;
            let datanode: DatanodeView = op
                .get_json_retrying(&format!("/v1/datanodes/{id}"))
                .await
                .map_err(|e| {
                    let unknown = e
                        .downcast_ref::<client::Answered>()
                        .is_some_and(|a| a.status == reqwest::StatusCode::NOT_FOUND);
                    if unknown {
                        e.context(format!(
                            "datanode {id} is not registered: register it first with PUT \
                             /v1/datanodes/{id} (its answer gives the epoch its shards are \
                             registered under)"
                        ))
                    } else {
                        e.context(format!("looking up datanode {id}'s epoch"))
                    }
                })?;
            (datanode.epoch, shards)
        }
    };
    if let Some((id, at)) = listed_twice(&shards) {
        bail!(
            "{} lists shard {id} twice (again as its shard number {at}): a datanode holds one \
             replica of a shard; nothing was registered",
            args.file.display()
        );
    }
    if shards.is_empty() && !args.prune {
        bail!("{} lists no shards", args.file.display());
    }
    let (accepted, unchanged, stale) = register_batches(&op, args.datanode, epoch, &shards)
        .await
        .with_context(|| {
        format!(
            "registering the shards of {} (nothing was pruned)",
            args.file.display()
        )
    })?;
    let mut out = serde_json::json!({
        "datanode": args.datanode,
        "epoch": epoch,
        "accepted": accepted,
        "unchanged": unchanged,
        "stale": stale,
    });
    if args.prune {
        let path = format!("/v1/datanodes/{}/prune", args.datanode);
        let body = serde_json::json!({ "epoch": epoch });
        let response = op
            .send_retrying(|| op.request(reqwest::Method::POST, &path).json(&body))
            .await?;
        let result: ShardsDeregistered = response.json().await.context("decoding the answer")?;
        out["pruned"] = result.removed.into();
    }
    let resent = op.resent_after_unknown();
    if resent > 0 {
        out["resent_after_unknown_outcome"] = resent.into();
        eprintln!(
            "metaserver: {resent} request(s) were sent again after an attempt whose outcome is \
             unknown (504, or cut off before the answer): replicas an earlier attempt registered \
             count as unchanged, and those it pruned are not in pruned"
        );
    }
    output::line(out)
}

/// Registers `shards` of `datanode` under `epoch` in batches; returns the replicas accepted, those
/// unchanged, and the stale shard ids. A batch that fails ends it, saying how many shards the
/// batches before it registered: those stay registered.
async fn register_batches(
    op: &Operator,
    datanode: u64,
    epoch: u64,
    shards: &[ShardBody],
) -> Result<(u64, u64, Vec<u64>)> {
    let (mut accepted, mut unchanged, mut stale) = (0u64, 0u64, Vec::new());
    let mut sent = 0;
    for batch in shards.chunks(MAX_SHARDS_PER_BATCH) {
        let body = serde_json::json!({ "epoch": epoch, "shards": batch.iter().map(|s| {
            serde_json::json!({"id": s.id, "generation": s.generation, "size": s.size})
        }).collect::<Vec<_>>() });
        let path = format!("/v1/datanodes/{datanode}/shards");
        let result: Result<ShardsRegistered> = async {
            let response = op
                .send_retrying(|| op.request(reqwest::Method::POST, &path).json(&body))
                .await?;
            response.json().await.context("decoding the answer")
        }
        .await;
        let result = result.with_context(|| match sent {
            0 => format!("none of the file's {} shards was registered", shards.len()),
            _ => format!(
                "the batches before this one registered {sent} of {} shards ({accepted} \
                 accepted, {unchanged} unchanged)",
                shards.len()
            ),
        })?;
        sent += batch.len();
        accepted += result.accepted;
        unchanged += result.unchanged;
        stale.extend(result.stale);
    }
    Ok((accepted, unchanged, stale))
}

/// How long building a snapshot, or downloading it, may take: a registry of many millions of
/// replicas, at a snapshot rate the operator set low, takes a while.
const SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// Asks the member `op` asks now (or the next ones, while they cannot answer, riding out a
/// leader change as [`Operator::send_retrying`] does: a member refuses to build one while it
/// knows no leader) to build a snapshot, and downloads it from the member that built it into a
/// synced temp file in `dir`: the build's answer, the file and its size.
async fn download_snapshot(
    op: &Operator,
    dir: &Path,
    local: bool,
) -> Result<(Value, tempfile::NamedTempFile, u64)> {
    let build = match local {
        true => "/v1/cluster/snapshot?consistency=local",
        false => "/v1/cluster/snapshot",
    };
    let built: Value = op
        .send_retrying(|| {
            op.request(reqwest::Method::POST, build)
                .timeout(SNAPSHOT_TIMEOUT)
        })
        .await?
        .json()
        .await
        .context("decoding the snapshot answer")?;
    // From the member that built it: another one's newest snapshot may be older.
    let response = op
        .send_here(
            op.request(reqwest::Method::GET, "/v1/cluster/snapshot")
                .timeout(SNAPSHOT_TIMEOUT),
        )
        .await?;
    let mut temp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    let mut bytes = 0u64;
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("downloading the snapshot")?;
        bytes += chunk.len() as u64;
        temp.write_all(&chunk)?;
    }
    temp.as_file().sync_all().context("syncing the snapshot")?;
    Ok((built, temp, bytes))
}

/// `metaserver snapshot save FILE`: builds a snapshot on the member, downloads it to a temp
/// file next to FILE, fsyncs it, verifies it as a restore would read it (every record, the
/// counts and the checksum), and only then renames it into place and fsyncs the directory.
///
/// FILE may be a symbolic link: the file it leads to is replaced, and the link kept. A path
/// that is neither (a directory, a device) is refused before anything is asked of the member.
///
/// With `local`, the member builds from its state as it is (`?consistency=local`): no leader
/// need confirm that it holds every acknowledged write.
///
/// Contract: on `Ok`, FILE is a complete, verified backup and the rename is durable. On `Err`,
/// FILE is as it was (an earlier backup there is kept) and the temp file is removed.
///
/// A snapshot built while the cluster was being restored (it holds the restore's mark: the
/// restore is under way, or was cut off) is refused unless `partial`, and FILE kept: it may hold
/// part of a backup only.
pub async fn snapshot_save(
    args: ClientArgs,
    file: &Path,
    local: bool,
    partial: bool,
) -> Result<()> {
    let op = Operator::new(&args)?;
    let file = &crate::scratch::backup_target(file)?;
    let dir = crate::scratch::parent_of(file);
    // A member that goes away while it builds or sends the snapshot (the connection cut, not
    // an answer) leaves the save to the next one given: building one again changes nothing.
    let mut left = op.members();
    let (built, temp, bytes) = loop {
        left -= 1;
        match download_snapshot(&op, &dir, local).await {
            Ok(done) => break done,
            Err(e) if left > 0 && Operator::cut_off(&e) => {
                let gone = op.member().to_owned();
                eprintln!(
                    "metaserver: {gone} went away while it built or sent the snapshot ({e:#}); \
                     asking the next member"
                );
                op.next_member(&gone);
            }
            // No leader within the wait (a majority of the voters lost, say): only a member's
            // own state can be saved then, which no leader confirms.
            Err(e)
                if !local
                    && e.downcast_ref::<client::Answered>()
                        .is_some_and(|a| a.status == reqwest::StatusCode::SERVICE_UNAVAILABLE) =>
            {
                return Err(e.context(
                    "no member could build a snapshot that a leader confirms holds every \
                     acknowledged write; if the cluster lost a majority of its voters for good, \
                     save what a survivor holds with --local (see the README's recovery steps)",
                ));
            }
            Err(e) => return Err(e),
        }
    };
    // A download that is not a usable backup (a damaged snapshot on the member, or another
    // server's page at the address) must not replace the last good one.
    let path = temp.path().to_path_buf();
    // Owned here, not by the blocking thread that checks: an interrupted save removes it.
    let scratch_dir = crate::scratch::ScratchDir::new_in(&dir)?;
    let scratch = scratch_dir.path().to_path_buf();
    let checked = tokio::task::spawn_blocking(move || {
        let backup = meta_consensus::Backup::open(&path, &scratch)?;
        // A backup no restore can take is no backup: say so now, not when it is needed.
        let restorable = crate::restore::restorable(&backup);
        let mark = crate::restore::partial_backup(&backup);
        anyhow::Ok((backup, restorable, mark))
    })
    .await
    .context("the backup reader stopped")?;
    let kept = || match file.exists() {
        true => format!("{} was left as it was", file.display()),
        false => format!("{} was not written", file.display()),
    };
    let (verified, restorable, mark) = checked.with_context(|| {
        format!(
            "the downloaded snapshot is not a usable backup, or could not be checked (the \
             check builds a scratch registry in {}, which takes up to about three times \
             the snapshot's {bytes} bytes); {}",
            dir.display(),
            kept()
        )
    })?;
    if let Err(e) = restorable {
        drop(verified);
        return Err(e.context(format!(
            "no restore can take this snapshot (a plain download of GET /v1/cluster/snapshot \
             still copies it); {}",
            kept()
        )));
    }
    let (index, replicas, keys) = (verified.index(), verified.replicas(), verified.keys());
    drop(verified);
    match mark.with_context(|| format!("reading the snapshot; {}", kept()))? {
        Some(mark) if !partial => bail!(
            "{mark}; {} (a save with --partial keeps it, marked as such)",
            kept()
        ),
        Some(mark) => eprintln!("warning: {mark}; kept as asked (--partial)"),
        None => {}
    }
    // A backup that replaces another keeps its permissions (a new one is the owner's only),
    // and its owner and group where this user may give them (root, or a group it is in).
    if let Ok(existing) = std::fs::metadata(file) {
        use std::os::unix::fs::MetadataExt as _;
        let (uid, gid) = (existing.uid(), existing.gid());
        let _ = std::os::unix::fs::fchown(temp.as_file(), Some(uid), Some(gid));
        temp.as_file()
            .set_permissions(existing.permissions())
            .with_context(|| {
                format!(
                    "giving the new backup the permissions of {}",
                    file.display()
                )
            })?;
    }
    temp.persist(file)
        .with_context(|| format!("renaming the snapshot to {}", file.display()))?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .with_context(|| {
            format!(
                "syncing the directory {} after the rename: {} may not survive a power loss",
                dir.display(),
                file.display()
            )
        })?;
    output::line(serde_json::json!({
        "file": file.display().to_string(),
        "bytes": bytes,
        "index": index,
        "replicas": replicas,
        "keys": keys,
        "snapshot": built,
    }))
}

#[cfg(test)]
mod save_tests;
#[cfg(test)]
mod tests;
