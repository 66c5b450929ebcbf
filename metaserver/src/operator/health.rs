//! `metaserver health`: every member's view at once, and whether the cluster is healthy. The
//! members are the ones the first member that answers names (voters and learners); each is
//! asked for its status (`GET /v1/cluster`) and readiness (`GET /readyz`) at its own address,
//! all at once. The command exits with an error naming each problem, so that a script or a
//! monitor can run it as it is.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use meta_http::response::{ClusterView, RestoreView};
use serde::Serialize;

use super::client::Refused;
use super::Operator;
use crate::cli::{ClientArgs, HealthArgs};
use crate::output;

/// How long one member may take to answer: one slower than this counts as not answering.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(5);

/// What one member said.
#[derive(Debug, Clone, Serialize)]
struct MemberHealth {
    id: u64,
    addr: String,
    /// Its own status, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<MemberStatus>,
    /// Whether `/readyz` answered 200.
    ready: bool,
    /// Why it is not ready, or why it did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    /// On a leader: each member's lag as it counts it.
    #[serde(skip)]
    lags: BTreeMap<u64, u64>,
    /// The members that lately refused its token (`token_refused_by`).
    #[serde(skip)]
    token_refused_by: Vec<u64>,
    /// The members that lately refused its messages as another cluster's (`refused_by`).
    #[serde(skip)]
    refused_by: Vec<u64>,
    /// Whether it refused the client token given while the member token passed.
    #[serde(skip)]
    refuses_client_token: bool,
    /// The mark of a restore that has not ended, as it applied it.
    #[serde(skip)]
    restore: Option<RestoreView>,
}

/// The part of a member's status the report shows.
#[derive(Debug, Clone, Serialize)]
struct MemberStatus {
    role: String,
    term: u64,
    leader_id: Option<u64>,
    applied: u64,
    /// Entries it is behind the leader's last, as the leader counts them (`None` on the
    /// leader, or when the leader did not answer).
    lag: Option<u64>,
    /// Bytes free on its data dir's file system, when it could tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir_free_bytes: Option<u64>,
    /// Its `--min-free-bytes`.
    min_free_bytes: u64,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    healthy: bool,
    leader_id: Option<u64>,
    term: Option<u64>,
    problems: Vec<String>,
    members: Vec<MemberHealth>,
}

/// `metaserver health`.
pub async fn health(args: HealthArgs) -> Result<()> {
    let nodes = match membership(&args.client).await {
        Ok(nodes) => nodes,
        Err(e) => {
            // A script reading the JSON report gets one, with the reason, also then.
            if args.json {
                let report = Report {
                    healthy: false,
                    leader_id: None,
                    term: None,
                    problems: vec![format!("{e:#}")],
                    members: Vec::new(),
                };
                let _ = output::line(serde_json::to_string_pretty(&report)?);
            }
            return Err(e);
        }
    };
    let asked = nodes.iter().map(|(id, addr)| ask(&args.client, *id, addr));
    let mut members = futures::future::join_all(asked).await;
    let report = judge(&mut members);
    let printed = match args.json {
        true => output::line(serde_json::to_string_pretty(&report)?),
        false => output::lines(table(&report.members)),
    };
    // The verdict is the command's answer: a reader that went away (`| head`) does not make
    // an unhealthy cluster exit 0, nor a healthy one: its reader did not get the report.
    if !report.healthy {
        bail!("the cluster is not healthy: {}", report.problems.join("; "));
    }
    printed.map_err(|e| match output::reader_gone(&e) {
        true => anyhow::anyhow!(
            "stdout was closed before the whole report was written: the cluster is healthy, \
             but a check reading it did not get the report"
        ),
        false => e,
    })
}

/// The members (id to address) that the first member given with `--server` that answers in
/// time, and belongs to a cluster, names. Each member given is asked once, for at most
/// [`MEMBER_TIMEOUT`]: a paused one, one that refuses the token, one in no cluster yet, or one
/// removed from its cluster (it names the members it left, not the cluster's now) makes the
/// command ask the next, not wait or stop.
async fn membership(client: &ClientArgs) -> Result<BTreeMap<u64, String>> {
    let op = Operator::new(client)?;
    let mut failures = Vec::new();
    loop {
        let asked = op.member().to_owned();
        match status_of(&op).await {
            Ok(view) if view.role == "removed" => {
                failures.push(format!("{asked} was removed from its cluster"))
            }
            Ok(view) if !view.nodes.is_empty() => return Ok(view.nodes),
            Ok(_) => failures.push(format!("{asked} is in no cluster yet")),
            Err(e) => failures.push(format!(
                "{e:#}{}",
                super::plain_http_hint(&e).unwrap_or_default()
            )),
        }
        if op.next_member(&asked) {
            bail!(
                "no member given names the cluster's members: {}",
                failures.join("; ")
            );
        }
    }
}

/// The status of the member `op` asks now, within [`MEMBER_TIMEOUT`].
async fn status_of(op: &Operator) -> Result<ClusterView> {
    let request = op
        .request(reqwest::Method::GET, "/v1/cluster")
        .timeout(MEMBER_TIMEOUT);
    op.send_here(request)
        .await?
        .json()
        .await
        .context("reading its status")
}

/// Asks member `id` at `addr` for its status and readiness.
async fn ask(client: &ClientArgs, id: u64, addr: &str) -> MemberHealth {
    let mut health = MemberHealth {
        id,
        addr: addr.to_owned(),
        status: None,
        ready: false,
        problem: None,
        lags: BTreeMap::new(),
        token_refused_by: Vec::new(),
        refused_by: Vec::new(),
        refuses_client_token: false,
        restore: None,
    };
    let one = ClientArgs {
        server: addr.to_owned(),
        ..client.clone()
    };
    let asked = async {
        let op = Operator::new(&one)?;
        let view = status_of(&op).await?;
        let ready = op
            .request(reqwest::Method::GET, "/readyz")
            .timeout(MEMBER_TIMEOUT)
            .send()
            .await
            .context("asking whether it is ready")?;
        let not_ready = match ready.status().is_success() {
            true => None,
            false => Some(Refused::read(ready).await.message().to_owned()),
        };
        anyhow::Ok((view, not_ready))
    };
    match asked.await {
        Ok((view, not_ready)) => {
            let refuses_client = refuses_client_token(client, addr).await;
            health.lags = view
                .replication
                .iter()
                .map(|(id, r)| (*id, r.lag))
                .collect();
            health.token_refused_by = view.token_refused_by.clone();
            health.refused_by = view.refused_by.clone();
            let tls_refused = view.tls_files_refused.clone();
            health.restore = view.restore.clone();
            health.status = Some(MemberStatus {
                role: view.role,
                term: view.term,
                leader_id: view.leader_id,
                applied: view.applied,
                lag: None,
                data_dir_free_bytes: view.data_dir_free_bytes,
                min_free_bytes: view.min_free_bytes,
            });
            health.ready = not_ready.is_none();
            health.problem = not_ready.map(|why| format!("not ready: {why}"));
            health.refuses_client_token = refuses_client;
            if refuses_client {
                health.problem = Some(
                    "refuses the client token (--token, METASERVER_TOKEN) that the member token \
                     passed: it was started with another --token, and datanodes holding the \
                     cluster's are refused there"
                        .to_owned(),
                );
            }
            if let Some(why) = tls_refused {
                let refused = format!(
                    "refuses its TLS files as they are now ({why}): it serves with the ones it \
                     took before, and would not start with these"
                );
                health.problem = Some(match health.problem.take() {
                    Some(other) => format!("{other}; {refused}"),
                    None => refused,
                });
            }
        }
        Err(e) => health.problem = Some(unanswered(client, &e)),
    }
    health
}

/// With a separate member token, which the command sends and which opens the member's routes
/// whatever its client token, whether the member at `addr` refuses the client token (401): a
/// member started with another `--token` refuses the datanodes. False when it cannot tell (no
/// client token given, or no answer).
async fn refuses_client_token(client: &ClientArgs, addr: &str) -> bool {
    match (client.member_token(), client.client_token()) {
        (Some(member), Some(token)) if member != token => {}
        _ => return false,
    }
    let as_client = ClientArgs {
        server: addr.to_owned(),
        member_token: None,
        ..client.clone()
    };
    let Ok(op) = Operator::new(&as_client) else {
        return false;
    };
    let request = op
        .request(reqwest::Method::GET, "/v1/cluster")
        .timeout(MEMBER_TIMEOUT);
    matches!(
        request.send().await,
        Ok(answer) if answer.status() == reqwest::StatusCode::UNAUTHORIZED
    )
}

/// Why a member's status could not be had, in words: it did not answer (not reached, or not
/// in time), or it answered with a refusal (a wrong token, say).
fn unanswered(client: &ClientArgs, e: &anyhow::Error) -> String {
    match e.downcast_ref::<super::client::Answered>() {
        Some(answered) if answered.status == reqwest::StatusCode::UNAUTHORIZED => {
            match client.member_token().is_some() {
                // The command sends the member token instead of --token.
                true => format!(
                    "refuses this command's member token ({answered}): the one given is not \
                     this cluster's, or the member was started with another --member-token"
                ),
                false => format!(
                    "refuses this command's token ({answered}): it was started with another \
                     --token"
                ),
            }
        }
        Some(answered) => format!("refused: {answered}"),
        // What answers TLS with something that is no TLS speaks plain HTTP.
        None if e.chain().any(meta_http::peer_client::answered_plain) => {
            format!(
                "answers in plain HTTP, not TLS: it was started without --tls-cert, --tls-key \
                 and --tls-ca ({e:#})"
            )
        }
        None => format!("does not answer: {e:#}"),
    }
}

/// Fills in the leader's count of each member's lag, and says what is wrong: a member that
/// does not answer or is not ready, no leader or more than one, a leader without a quorum,
/// members that name another leader than the one that leads, a member short of disk.
fn judge(members: &mut [MemberHealth]) -> Report {
    let mut problems = Vec::new();
    let leading: Vec<(u64, u64)> = members
        .iter()
        .filter_map(|m| {
            let s = m.status.as_ref()?;
            s.role.starts_with("leader").then_some((m.id, s.term))
        })
        .collect();
    // The newest term's leader, when several say they lead (the others are deposed and do
    // not know it yet).
    let leader = leading.iter().max_by_key(|(_, term)| *term).copied();
    match leading.len() {
        0 => problems.push("no member leads".to_owned()),
        1 => {}
        _ => {
            let ids: Vec<String> = leading.iter().map(|(id, _)| id.to_string()).collect();
            problems.push(format!("nodes {} each say they lead", ids.join(", ")));
        }
    }
    let leading = leader.and_then(|(id, _)| members.iter().find(|m| m.id == id));
    let mut lags = leading.map(|m| m.lags.clone()).unwrap_or_default();
    if let Some(l) = leading {
        for id in &l.refused_by {
            problems.push(format!(
                "node {id} refuses the leader's messages as another cluster's: its data dir \
                 belongs to another cluster (a wrong --data-dir, or a node initialized on its \
                 own); it holds none of this cluster's log"
            ));
            // The leader's count of it means nothing: it takes none of the leader's entries.
            lags.remove(id);
        }
        for id in &l.token_refused_by {
            problems.push(format!(
                "node {id} and the leader, node {}, refuse each other's token (401): one of them \
                 was started with another --token, or --member-token",
                l.id
            ));
        }
    }
    // As the leader applied it (a follower may lag behind its end), else as any member did.
    let restore = match leading {
        Some(l) => l.restore.as_ref(),
        None => members.iter().find_map(|m| m.restore.as_ref()),
    };
    if let Some(r) = restore {
        problems.push(unended_restore(r));
    }
    // Refused by every member, the client token given is the one at fault, not theirs.
    let answered = members.iter().filter(|m| m.status.is_some());
    let all_refuse = members.iter().any(|m| m.refuses_client_token)
        && answered.clone().all(|m| m.refuses_client_token);
    if all_refuse {
        problems.push(
            "every member refuses the client token given (--token, METASERVER_TOKEN) that the \
             member token passed: it is not this cluster's client token"
                .to_owned(),
        );
        for m in members.iter_mut().filter(|m| m.refuses_client_token) {
            m.problem = Some("refuses the client token given".to_owned());
        }
    }
    for m in members.iter_mut() {
        if let Some(why) = &m.problem {
            if !(all_refuse && m.refuses_client_token) {
                problems.push(format!("node {} at {} {why}", m.id, m.addr));
            }
        }
        let Some(s) = m.status.as_mut() else {
            continue;
        };
        if s.role == "leader_without_quorum" {
            problems.push(format!("node {} leads without a quorum", m.id));
        }
        match s.data_dir_free_bytes {
            Some(free) if free < s.min_free_bytes => problems.push(format!(
                "node {} is short of disk: {free} bytes free, {} kept in reserve (leading, it \
                 refuses writes that add data; following, it stops once the disk is full)",
                m.id, s.min_free_bytes
            )),
            _ => {}
        }
        if let Some((leader, term)) = leader {
            // The leader itself names none while no quorum acknowledged it (said above).
            if s.leader_id != Some(leader) && m.id != leader {
                let named = s
                    .leader_id
                    .map_or("no leader".to_owned(), |l| format!("node {l}"));
                problems.push(format!(
                    "node {} names {named} (term {}), not node {leader} (term {term})",
                    m.id, s.term
                ));
            }
        }
        s.lag = lags.get(&m.id).copied();
    }
    Report {
        healthy: problems.is_empty(),
        leader_id: leader.map(|(id, _)| id),
        term: leader.map(|(_, term)| term),
        problems,
        members: members.to_vec(),
    }
}

/// The problem of a cluster whose restore has not ended.
fn unended_restore(r: &RestoreView) -> String {
    let b = &r.backup;
    format!(
        "a restore into the cluster has not ended (claimed at index {}, replaying a backup of \
         index {}: datanodes {}, replicas {}, keys {}): it is under way, or was cut off \
         part way and the cluster holds part of the backup (run it again into fresh data dirs; \
         `metaserver snapshot end-restore` keeps what the cluster holds)",
        r.claimed_at, b.index, b.datanodes, b.replicas, b.keys
    )
}

/// A member's free space in its data dir, in binary units, marked when it is short of disk
/// (below the reserve it keeps); `-` when it could not tell.
fn free_space(s: &MemberStatus) -> String {
    let Some(free) = s.data_dir_free_bytes else {
        return "-".to_owned();
    };
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = free as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    let amount = match unit {
        0 => format!("{free} B"),
        _ => format!("{value:.1} {}", units[unit]),
    };
    match free < s.min_free_bytes {
        true => format!("{amount} (short)"),
        false => amount,
    }
}

/// The report as a table: a header, then one line per member.
fn table(members: &[MemberHealth]) -> Vec<String> {
    let mut rows = vec![[
        "node", "address", "role", "term", "leader", "applied", "lag", "free", "ready",
    ]
    .map(str::to_owned)
    .to_vec()];
    for m in members {
        let cells = match &m.status {
            Some(s) => vec![
                s.role.clone(),
                s.term.to_string(),
                s.leader_id.map_or("-".into(), |l| l.to_string()),
                s.applied.to_string(),
                s.lag.map_or("-".into(), |l| l.to_string()),
                free_space(s),
            ],
            None => vec!["-".to_owned(); 6],
        };
        let ready = match (&m.problem, m.ready) {
            (_, true) => "yes".to_owned(),
            (Some(why), false) => format!("no: {why}"),
            (None, false) => "no".to_owned(),
        };
        let mut row = vec![m.id.to_string(), m.addr.clone()];
        row.extend(cells);
        row.push(ready);
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, role: &str, term: u64, leader: Option<u64>) -> MemberHealth {
        MemberHealth {
            id,
            addr: format!("h{id}:1"),
            status: Some(MemberStatus {
                role: role.into(),
                term,
                leader_id: leader,
                applied: 10,
                lag: None,
                data_dir_free_bytes: Some(1 << 30),
                min_free_bytes: 1 << 27,
            }),
            ready: true,
            problem: None,
            lags: BTreeMap::new(),
            token_refused_by: Vec::new(),
            refused_by: Vec::new(),
            refuses_client_token: false,
            restore: None,
        }
    }

    #[test]
    fn one_leader_that_all_follow_is_healthy_and_gives_the_lags() {
        let mut leader = member(1, "leader", 3, Some(1));
        leader.lags = BTreeMap::from([(2, 0), (3, 7)]);
        let mut members = vec![
            leader,
            member(2, "follower", 3, Some(1)),
            member(3, "learner", 3, Some(1)),
        ];
        let report = judge(&mut members);
        assert!(report.healthy, "{:?}", report.problems);
        assert_eq!((report.leader_id, report.term), (Some(1), Some(3)));
        let lags: Vec<_> = report
            .members
            .iter()
            .map(|m| m.status.as_ref().unwrap().lag)
            .collect();
        assert_eq!(lags, [None, Some(0), Some(7)]);
        let table = table(&report.members);
        assert_eq!(table.len(), 4);
        assert_eq!(
            table[3],
            "3     h3:1     learner   3     1       10       7    1.0 GiB  yes"
        );
    }

    #[test]
    fn each_problem_is_named() {
        let mut down = member(4, "follower", 3, None);
        down.status = None;
        down.ready = false;
        down.problem = Some("does not answer: connection refused".into());
        let mut leader = member(2, "leader", 3, Some(2));
        leader.token_refused_by = vec![3];
        leader.status.as_mut().unwrap().data_dir_free_bytes = Some(100);
        let mut members = vec![
            member(1, "leader_without_quorum", 2, Some(1)),
            leader,
            member(3, "follower", 2, Some(1)),
            down,
        ];
        let report = judge(&mut members);
        assert!(!report.healthy);
        assert_eq!(report.leader_id, Some(2), "the newest term's");
        assert_eq!(
            report.problems,
            [
                "nodes 1, 2 each say they lead",
                "node 3 and the leader, node 2, refuse each other's token (401): one of them was \
                 started with another --token, or --member-token",
                "node 1 leads without a quorum",
                "node 1 names node 1 (term 2), not node 2 (term 3)",
                "node 2 is short of disk: 100 bytes free, 134217728 kept in reserve (leading, it \
                 refuses writes that add data; following, it stops once the disk is full)",
                "node 3 names node 1 (term 2), not node 2 (term 3)",
                "node 4 at h4:1 does not answer: connection refused",
            ]
        );
        // The table marks the member short of disk, though it is ready.
        let rows = table(&report.members);
        assert!(rows[2].ends_with("  100 B (short)  yes"), "{}", rows[2]);
        let cells: Vec<&str> = rows[4].split_whitespace().take(9).collect();
        assert_eq!(cells, ["4", "h4:1", "-", "-", "-", "-", "-", "-", "no:"]);
        let report = judge(&mut [member(1, "follower", 1, None)]);
        assert_eq!(report.problems, ["no member leads"]);
    }

    #[test]
    fn a_client_token_every_member_refuses_is_named_as_the_one_at_fault() {
        let refusing = |mut m: MemberHealth| {
            m.refuses_client_token = true;
            m.problem = Some("refuses the client token (--token, METASERVER_TOKEN)".into());
            m
        };
        let mut leader = member(1, "leader", 3, Some(1));
        leader.lags = BTreeMap::from([(2, 0), (3, 0)]);
        let mut down = member(3, "follower", 3, None);
        down.status = None;
        down.ready = false;
        down.problem = Some("does not answer: connection refused".into());
        let mut members = vec![
            refusing(leader),
            refusing(member(2, "follower", 3, Some(1))),
            down,
        ];
        let report = judge(&mut members);
        assert_eq!(
            report.problems,
            [
                "every member refuses the client token given (--token, METASERVER_TOKEN) that \
                 the member token passed: it is not this cluster's client token",
                "node 3 at h3:1 does not answer: connection refused",
            ]
        );
        // One member of three refusing it: that member was started with another --token.
        let mut members = vec![
            member(1, "leader", 3, Some(1)),
            refusing(member(2, "follower", 3, Some(1))),
        ];
        let report = judge(&mut members);
        assert_eq!(
            report.problems,
            ["node 2 at h2:1 refuses the client token (--token, METASERVER_TOKEN)"]
        );
    }

    #[test]
    fn a_member_of_another_cluster_is_named_and_shows_no_lag() {
        let mut leader = member(1, "leader", 5, Some(1));
        leader.lags = BTreeMap::from([(2, 0), (3, 0)]);
        leader.refused_by = vec![2];
        let mut members = vec![
            leader,
            member(2, "follower", 5, Some(1)),
            member(3, "follower", 5, Some(1)),
        ];
        let report = judge(&mut members);
        assert!(!report.healthy);
        assert!(
            report.problems[0]
                .starts_with("node 2 refuses the leader's messages as another cluster's"),
            "{:?}",
            report.problems
        );
        let lags: Vec<_> = report
            .members
            .iter()
            .map(|m| m.status.as_ref().unwrap().lag)
            .collect();
        assert_eq!(lags, [None, None, Some(0)]);
    }

    #[test]
    fn a_leader_without_a_quorum_is_not_said_to_name_another() {
        // Such a leader knows no leader (itself unconfirmed); it was reported as naming
        // "no leader, not node 3".
        let mut members = vec![
            member(3, "leader_without_quorum", 13, None),
            member(1, "follower", 13, Some(3)),
        ];
        let report = judge(&mut members);
        assert_eq!(report.problems, ["node 3 leads without a quorum"]);
    }

    /// A member that refuses its renewed TLS files (it serves with the old ones, and would not
    /// start with these) makes the cluster unhealthy, named with why: it looked healthy until
    /// its next restart failed.
    #[tokio::test]
    async fn a_member_refusing_its_tls_files_is_named() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let view = serde_json::json!({
            "id": 1, "role": "leader", "leader_id": 1, "leader_addr": addr, "term": 2,
            "voters": [1], "learners": [], "nodes": {"1": addr}, "last_log_index": 5,
            "committed": 5, "applied": 5, "purged": 0,
            "wal": {"appends": 5, "barriers": 5, "appends_per_barrier": 1.0},
            "datanodes": 0, "replicas": 0, "replication": {}, "cluster_version": 7,
            "build_version": 7, "epoch_floor": 0, "member_versions": {"1": 7},
            "data_dir_free_bytes": 1u64 << 30, "min_free_bytes": 1 << 20,
            "tls_files_refused": "the private key does not match the certificate"
        })
        .to_string();
        let app = axum::Router::new()
            .route("/readyz", axum::routing::get(|| async { "ready" }))
            .fallback(move || {
                let view = view.clone();
                async move { ([("content-type", "application/json")], view) }
            });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let args = HealthArgs {
            client: ClientArgs {
                server: addr.clone(),
                token: None,
                member_token: None,
                tls_ca: None,
            },
            json: false,
        };
        let e = health(args).await.unwrap_err();
        let message = format!("{e:#}");
        assert!(
            message.contains(&format!(
                "node 1 at {addr} refuses its TLS files as they are now (the private key does \
                 not match the certificate)"
            )),
            "{message}"
        );
    }
}
