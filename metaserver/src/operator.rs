//! Operator commands over the admin API: `status`, `shards`, `register`, `watch` and
//! `snapshot save`
//! (`snapshot restore` is in `restore.rs`).
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
mod members;

pub(crate) use client::Operator;

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

/// `metaserver status`: the member's view, as pretty JSON.
pub async fn status(args: ClientArgs) -> Result<()> {
    print_view::<ClusterView>(&args, "/v1/cluster").await
}

/// `metaserver liveness`: the leader's liveness report, as pretty JSON.
pub async fn liveness(args: ClientArgs) -> Result<()> {
    print_view::<LivenessView>(&args, "/v1/liveness").await
}

/// Reads `path` as a `T` (so an answer of another shape is an error) and prints it as pretty
/// JSON.
async fn print_view<T: serde::de::DeserializeOwned + serde::Serialize>(
    args: &ClientArgs,
    path: &str,
) -> Result<()> {
    let op = Operator::new(args)?;
    let view: T = op.get_json(path).await?;
    output::line(serde_json::to_string_pretty(&view)?)
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

/// `metaserver watch [--after N] [--datanode N | --prefix P] [--once]`: every change after the
/// index (or from now), one JSON event per line, until interrupted. It rides out a member that
/// cannot answer for a while (503, a refused connection) by asking the next member given, or
/// the same again, every second (every member counts the same indexes); a
/// history that no longer holds its index (410 `compacted`) ends it with an error, and so does
/// an address no request can be made to.
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
    let mut history: Option<String> = None;
    let mut retrying = Outage::default();
    loop {
        let asked = op.member().to_owned();
        let mut request = op.request(reqwest::Method::GET, "/v1/watch").query(&filter);
        if let Some(after) = after {
            request = request.query(&[("after", after.to_string())]);
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
        let page: WatchPage = match sent {
            Ok(r) if r.status().is_success() => {
                r.json().await.context("decoding a watch answer")?
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
            Err(e) if e.is_builder() => {
                return Err(anyhow::Error::new(e).context("watching"));
            }
            Ok(r) => {
                retrying.note(&asked, &format!("status {}", r.status()));
                if op.next_member(&asked) {
                    tokio::time::sleep(WATCH_RETRY).await;
                }
                continue;
            }
            Err(e) => {
                retrying.note(&asked, &e.to_string());
                if op.next_member(&asked) {
                    tokio::time::sleep(WATCH_RETRY).await;
                }
                continue;
            }
        };
        retrying.recovered(&asked);
        output::json_lines(&page.events)?;
        let started = after.is_some();
        after = Some(page.index);
        if page.history.is_some() {
            history = page.history;
        }
        if args.once && started && !page.events.is_empty() {
            return Ok(());
        }
    }
}

/// `metaserver register --datanode N --file shards.json`: registers the shards in batches of
/// at most 10,000 under the datanode's current epoch (or the file's); with `--prune`, then
/// drops the datanode's replicas that no batch of that epoch registered.
pub async fn register(args: RegisterArgs) -> Result<()> {
    let op = Operator::new(&args.client)?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let parsed = ShardsFile::parse(&text).with_context(|| {
        format!(
            "{} is not a list of {{\"id\",\"generation\",\"size\"}} nor {{\"epoch\",\"shards\"}}",
            args.file.display()
        )
    })?;
    let (epoch, shards) = match parsed {
        ShardsFile::Batch(BatchFile { epoch, shards }) => (epoch, shards),
        ShardsFile::List(shards) => {
            let id = args.datanode;
            let datanode: DatanodeView = op
                .get_json(&format!("/v1/datanodes/{id}"))
                .await
                .map_err(|e| {
                    let unknown = e
                        .downcast_ref::<client::Answered>()
                        .is_some_and(|a| a.status == reqwest::StatusCode::NOT_FOUND);
                    if unknown {
                        e.context(format!(
                            "datanode {id} is not registered: register it first with PUT \
                             /v1/datanodes/{id}, or give the epoch in the file"
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
            .send(|| op.request(reqwest::Method::POST, &path).json(&body))
            .await?;
        let result: ShardsDeregistered = response.json().await.context("decoding the answer")?;
        out["pruned"] = result.removed.into();
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
                .send(|| op.request(reqwest::Method::POST, &path).json(&body))
                .await?;
            response.json().await.context("decoding the answer")
        }
        .await;
        let result = result.with_context(|| {
            format!(
                "the batches before this one registered {sent} of {} shards ({accepted} \
                 accepted, {unchanged} unchanged)",
                shards.len()
            )
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

/// `metaserver snapshot save FILE`: builds a snapshot on the member, downloads it to a temp
/// file next to FILE, fsyncs it, verifies it as a restore would read it (every record, the
/// counts and the checksum), and only then renames it into place and fsyncs the directory.
///
/// FILE may be a symbolic link: the file it leads to is replaced, and the link kept. A path
/// that is neither (a directory, a device) is refused before anything is asked of the member.
///
/// Contract: on `Ok`, FILE is a complete, verified backup and the rename is durable. On `Err`,
/// FILE is as it was (an earlier backup there is kept) and the temp file is removed.
pub async fn snapshot_save(args: ClientArgs, file: &Path) -> Result<()> {
    let op = Operator::new(&args)?;
    let file = &crate::scratch::backup_target(file)?;
    let built: Value = op
        .send(|| {
            op.request(reqwest::Method::POST, "/v1/cluster/snapshot")
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
    let dir = crate::scratch::parent_of(file);
    let mut temp = tempfile::NamedTempFile::new_in(&dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    let mut bytes = 0u64;
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("downloading the snapshot")?;
        bytes += chunk.len() as u64;
        temp.write_all(&chunk)?;
    }
    temp.as_file().sync_all().context("syncing the snapshot")?;
    // A download that is not a usable backup (a damaged snapshot on the member, or another
    // server's page at the address) must not replace the last good one.
    let path = temp.path().to_path_buf();
    // Owned here, not by the blocking thread that checks: an interrupted save removes it.
    let scratch_dir = crate::scratch::ScratchDir::new_in(&dir)?;
    let scratch = scratch_dir.path().to_path_buf();
    let verified = tokio::task::spawn_blocking(move || {
        let backup = meta_consensus::Backup::open(&path, &scratch)?;
        // A backup no restore can take is no backup: say so now, not when it is needed.
        crate::restore::restorable(&backup).context(
            "no restore can take this snapshot (a plain download of GET /v1/cluster/snapshot \
             still copies it)",
        )?;
        anyhow::Ok(backup)
    })
    .await
    .context("the backup reader stopped")?
    .with_context(|| {
        format!(
            "the downloaded snapshot is not a usable backup, or could not be checked (the \
             check builds a scratch registry in {}, which takes up to about three times \
             the snapshot's {bytes} bytes); {} was left as it was",
            dir.display(),
            file.display()
        )
    })?;
    let (index, replicas, keys) = (verified.index(), verified.replicas(), verified.keys());
    drop(verified);
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
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    use super::*;

    #[test]
    fn a_shard_listed_twice_is_found_across_batches() {
        let shard = |id| ShardBody {
            id,
            generation: 1,
            size: 1,
        };
        let mut shards: Vec<ShardBody> = (1..=MAX_SHARDS_PER_BATCH as u64).map(shard).collect();
        assert_eq!(listed_twice(&shards), None);
        shards.push(shard(1));
        assert_eq!(
            listed_twice(&shards),
            Some((1, MAX_SHARDS_PER_BATCH + 1)),
            "a duplicate in a later batch than the first"
        );
    }

    #[test]
    fn a_shards_file_that_does_not_parse_says_what_is_wrong() {
        let list = ShardsFile::parse(r#" [{"id":1,"generation":2,"size":3}]"#).unwrap();
        assert!(matches!(list, ShardsFile::List(s) if s.len() == 1));
        let batch = ShardsFile::parse(r#"{"epoch":4,"shards":[]}"#).unwrap();
        assert!(matches!(
            batch,
            ShardsFile::Batch(BatchFile { epoch: 4, .. })
        ));
        let error = |text: &str| format!("{:#}", ShardsFile::parse(text).unwrap_err());
        let missing = error(r#"[{"id":1,"generation":2}]"#);
        assert!(missing.contains("missing field `size`"), "{missing}");
        let unknown = error(r#"{"epoch":4,"shards":[],"datanode":7}"#);
        assert!(unknown.contains("unknown field `datanode`"), "{unknown}");
        assert!(error("7").contains("no JSON list or object"));
    }

    /// A server on loopback that answers the n-th request (from 0) with `status(n)`, counting.
    async fn server(status: fn(usize) -> StatusCode) -> (String, Arc<AtomicUsize>) {
        answering(move |n| (status(n), "{}")).await
    }

    /// A server on loopback that answers the n-th request (from 0) with `answer(n)`, counting;
    /// a 503 with `Retry-After`, as a member's (but those where waiting does not help) is.
    async fn answering(
        answer: impl Fn(usize) -> (StatusCode, &'static str) + Clone + Send + Sync + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        answering_with(move |n| {
            let (status, body) = answer(n);
            let mut response = (status, body).into_response();
            if status == StatusCode::SERVICE_UNAVAILABLE {
                let retry = axum::http::HeaderValue::from_static("1");
                response.headers_mut().insert("retry-after", retry);
            }
            response
        })
        .await
    }

    /// A server on loopback that answers the n-th request (from 0) with `answer(n)`, counting.
    async fn answering_with(
        answer: impl Fn(usize) -> axum::response::Response + Clone + Send + Sync + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        let app = axum::Router::new().fallback(move || {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let answer = answer(n);
            async move { answer }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr, count)
    }

    /// A shards file without an epoch takes the datanode's: one not registered is told to
    /// register first, and a lookup refused otherwise (a wrong token, say) is not.
    #[tokio::test]
    async fn a_datanode_lookup_that_fails_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("shards.json");
        std::fs::write(&file, r#"[{"id":1,"generation":1,"size":1}]"#).unwrap();
        let register_at = |status: StatusCode| {
            let file = file.clone();
            async move {
                let (addr, _) = answering(move |_| (status, "{}")).await;
                let args = RegisterArgs {
                    client: ClientArgs {
                        server: addr,
                        token: None,
                        tls_ca: None,
                    },
                    datanode: 7,
                    file,
                    prune: false,
                };
                format!("{:#}", register(args).await.unwrap_err())
            }
        };
        let unknown = register_at(StatusCode::NOT_FOUND).await;
        assert!(
            unknown.contains("datanode 7 is not registered"),
            "{unknown}"
        );
        let refused = register_at(StatusCode::UNAUTHORIZED).await;
        assert!(
            refused.contains("looking up datanode 7's epoch"),
            "{refused}"
        );
        assert!(!refused.contains("register it first"), "{refused}");
    }

    /// A request that no member given could answer names how many were tried, not only the
    /// last one.
    #[tokio::test]
    async fn a_request_no_member_answered_says_all_were_tried() {
        let closed = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let op = operator(format!("{},{}", closed(), closed()));
        let e = op
            .send(|| op.request(reqwest::Method::GET, "/v1/cluster"))
            .await
            .unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("the last of the 2 members given"), "{text}");
    }

    fn operator(addr: String) -> Operator {
        Operator::new(&ClientArgs {
            server: addr,
            token: None,
            tls_ca: None,
        })
        .unwrap()
    }

    /// Sent again without a leader (503), and when the outcome is unknown (504: its leader
    /// crashed while it ran; the callers send only requests that apply once).
    #[tokio::test]
    async fn requests_are_sent_again_without_a_leader_or_an_outcome_and_not_after_a_refusal() {
        let (addr, count) = server(|n| match n {
            0 => StatusCode::SERVICE_UNAVAILABLE,
            1 => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::OK,
        })
        .await;
        let op = operator(addr);
        op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
            .await
            .unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 3);

        let (addr, count) = server(|_| StatusCode::CONFLICT).await;
        let op = operator(addr);
        let err = op
            .send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("409"), "{err}");
        assert_eq!(count.load(Ordering::SeqCst), 1, "a refusal is not retried");
    }

    /// An address nothing listens at: connections to it are refused, as to a stopped member.
    /// The socket keeps it bound (without listening) so that no other test takes it.
    fn closed_port() -> (String, tokio::net::TcpSocket) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        (socket.local_addr().unwrap().to_string(), socket)
    }

    /// With several members, a request that one cannot answer (it is down, or serves no
    /// cluster) goes to the next, whether it is sent until it is answered or once; the only
    /// member that serves no cluster (503 without `Retry-After`) is not asked again.
    #[tokio::test]
    async fn a_request_goes_to_the_next_member_when_one_cannot_answer() {
        let (ok, ok_count) = server(|_| StatusCode::OK).await;
        let (down, _kept) = closed_port();
        let op = operator(format!("{down},{ok}"));
        op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
            .await
            .unwrap();
        assert_eq!(ok_count.load(Ordering::SeqCst), 1);
        assert_eq!(
            op.member(),
            format!("http://{ok}"),
            "it stays with the one that answers"
        );
        // So does a request that is sent once (status, a listing, a registration).
        let op = operator(format!("{down},{ok}"));
        let _: Value = op.get_json("/v1/cluster").await.unwrap();
        assert_eq!(ok_count.load(Ordering::SeqCst), 2);
        let err = operator(down.clone())
            .get_json::<Value>("/v1/cluster")
            .await;
        assert!(
            format!("{:#}", err.unwrap_err()).contains(&down),
            "names the member"
        );

        let removed = || {
            let body = r#"{"error":{"code":"no_leader","message":"removed"}}"#;
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        };
        let (alone, count) = answering_with(move |_| removed()).await;
        let op = operator(alone.clone());
        let refused = op
            .answer_retrying(|| op.request(reqwest::Method::PUT, "/x"))
            .await
            .unwrap()
            .expect_err("refused");
        assert_eq!(refused.code(), Some("no_leader"));
        assert_eq!(count.load(Ordering::SeqCst), 1, "not asked again");

        let (ok, ok_count) = server(|_| StatusCode::OK).await;
        let op = operator(format!("{alone},{ok}"));
        op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
            .await
            .unwrap();
        assert_eq!(ok_count.load(Ordering::SeqCst), 1);
    }

    /// A request cut off before its answer (the member went away) is sent again, as a 504 is.
    #[tokio::test]
    async fn a_request_cut_off_before_its_answer_is_sent_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (ok_addr, ok_count) = server(|_| StatusCode::OK).await;
        let cut = Arc::new(AtomicUsize::new(0));
        let cuts = cut.clone();
        tokio::spawn(async move {
            // The first connection is cut; later ones are passed to a member that answers.
            let (first, _) = listener.accept().await.unwrap();
            cuts.fetch_add(1, Ordering::SeqCst);
            drop(first);
            while let Ok((mut conn, _)) = listener.accept().await {
                let ok_addr = ok_addr.clone();
                tokio::spawn(async move {
                    let mut upstream = tokio::net::TcpStream::connect(ok_addr).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                });
            }
        });
        let op = operator(addr);
        op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
            .await
            .unwrap();
        assert_eq!(
            (cut.load(Ordering::SeqCst), ok_count.load(Ordering::SeqCst)),
            (1, 1)
        );
    }

    #[tokio::test]
    async fn a_failed_batch_says_how_far_the_registration_got() {
        let (addr, count) = answering(|n| match n {
            0 => (
                StatusCode::OK,
                r#"{"accepted":9000,"unchanged":1000,"stale":[],"index":7}"#,
            ),
            _ => (StatusCode::CONFLICT, r#"{"error":{"code":"fenced"}}"#),
        })
        .await;
        let op = operator(addr);
        let shards: Vec<ShardBody> = (0..MAX_SHARDS_PER_BATCH as u64 + 5)
            .map(|id| ShardBody {
                id,
                generation: 1,
                size: 1,
            })
            .collect();
        let err = register_batches(&op, 7, 3, &shards).await.unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("registered 10000 of 10005 shards (9000 accepted, 1000 unchanged)"),
            "{message}"
        );
        assert!(message.contains("409"), "{message}");
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_download_that_is_not_a_backup_leaves_the_earlier_backup_in_place() {
        // The member answers the build, then serves bytes that are no snapshot (a damaged
        // file, or another server at the address).
        let (addr, _) = answering(|n| match n {
            0 => (StatusCode::OK, "{}"),
            _ => (StatusCode::OK, "<html>not a snapshot</html>"),
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("meta.snap");
        std::fs::write(&file, b"the earlier backup").unwrap();
        let err = snapshot_save(
            ClientArgs {
                server: addr,
                token: None,
                tls_ca: None,
            },
            &file,
        )
        .await
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("not a usable backup"),
            "{err:#}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"the earlier backup");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("meta.snap")],
            "no temp file is left"
        );
    }

    #[tokio::test]
    async fn a_watch_gives_back_the_history_its_index_counts_in() {
        // A member that counts in history "aaaa" refuses an index given without it (as a
        // restored cluster's member refuses the old cluster's), and answers one given with it.
        let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
            let query = uri.query().unwrap_or_default().to_owned();
            if !query.contains("after=") {
                (StatusCode::OK, r#"{"index":5,"history":"aaaa","events":[]}"#)
            } else if query.contains("history=aaaa") {
                (
                    StatusCode::OK,
                    r#"{"index":6,"history":"aaaa","events":[{"index":6,"kind":"kv_put","key":"k"}]}"#,
                )
            } else {
                (
                    StatusCode::GONE,
                    r#"{"error":{"code":"compacted","message":"no history given"}}"#,
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        // The first member given is down: the watch moves on to the next.
        let (down, _kept) = closed_port();
        let args = WatchArgs {
            client: ClientArgs {
                server: format!("{down},{addr}"),
                token: None,
                tls_ca: None,
            },
            after: None,
            datanode: None,
            prefix: None,
            once: true,
        };
        watch(args).await.unwrap();
    }
}
