//! `metaserver member`: the membership changes an operator makes, one node at a time, through
//! the API's routes that name one node (`/v1/cluster/learners`, `/v1/cluster/voters/{id}`,
//! `/v1/cluster/leader`): the leader computes each new voter set itself, so two operators
//! changing different nodes at once do not undo each other's change, as two whole voter sets
//! computed from one earlier read would.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use meta_http::response::{ClusterView, LeaderView, MembershipView};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::client::Refused;
use super::Operator;
use crate::cli::MemberCommand;
use crate::output;

/// How often a promotion is asked again while the learner catches up.
const PROMOTE_AGAIN: Duration = Duration::from_secs(1);
/// How often waiting for a learner to catch up is reported on stderr.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Runs one `member` command and prints what it leaves, as pretty JSON.
pub async fn member(command: MemberCommand) -> Result<()> {
    match command {
        MemberCommand::Add {
            client,
            id,
            addr,
            voter,
            wait_secs,
        } => {
            let op = Operator::new(&client)?;
            let body = json!({ "id": id, "addr": addr });
            let added =
                change::<MembershipView>(&op, Method::POST, "/v1/cluster/learners", Some(body))
                    .await?;
            let added = match added {
                Ok(added) => added,
                // A voter at that address already, with --voter: what this command makes (an
                // earlier run whose answer was lost, say), so it is done, as a promotion of a
                // voter is.
                Err(refused)
                    if voter
                        && refused.status == StatusCode::CONFLICT
                        && voter_at(&op, id, &addr).await =>
                {
                    return print(&promote(&op, id, Duration::from_secs(wait_secs)).await?);
                }
                Err(refused) => {
                    return Err(op.refused_error(refused))
                        .with_context(|| format!("adding node {id} at {addr} as a learner"))
                }
            };
            if !voter {
                return print(&added);
            }
            print(&promote(&op, id, Duration::from_secs(wait_secs)).await?)
        }
        MemberCommand::Promote {
            client,
            id,
            wait_secs,
        } => {
            let op = Operator::new(&client)?;
            print(&promote(&op, id, Duration::from_secs(wait_secs)).await?)
        }
        MemberCommand::Remove { client, id } => {
            let op = Operator::new(&client)?;
            print(&remove(&op, id).await?)
        }
        MemberCommand::Leader { client, id } => {
            let op = Operator::new(&client)?;
            let leader: LeaderView = change(
                &op,
                Method::PUT,
                "/v1/cluster/leader",
                Some(json!({ "id": id })),
            )
            .await?
            .map_err(|refused| op.refused_error(refused))
            .with_context(|| format!("moving the leadership to node {id}"))?;
            print(&leader)
        }
    }
}

/// Makes learner `id` a voter, asking again while the leader refuses it with 409 (the learner
/// is still catching up, or was not heard from lately) for at most `wait`, and saying on
/// stderr, every [`REPORT_EVERY`], why it waits.
pub(super) async fn promote(op: &Operator, id: u64, wait: Duration) -> Result<MembershipView> {
    let path = format!("/v1/cluster/voters/{id}");
    let deadline = Instant::now() + wait;
    let mut reported: Option<Instant> = None;
    loop {
        let refused = match change(op, Method::PUT, &path, None).await? {
            Ok(view) => return Ok(view),
            Err(refused) => refused,
        };
        if refused.status != StatusCode::CONFLICT || Instant::now() + PROMOTE_AGAIN > deadline {
            return Err(op.refused_error(refused))
                .with_context(|| format!("making node {id} a voter"));
        }
        if reported.is_none_or(|at| at.elapsed() >= REPORT_EVERY) {
            reported = Some(Instant::now());
            eprintln!(
                "metaserver: node {id} cannot become a voter yet ({}); asking again every second \
                 for up to {} s in all",
                refused.message(),
                wait.as_secs()
            );
        }
        tokio::time::sleep(PROMOTE_AGAIN).await;
    }
}

/// Whether the cluster's members (as a member given answers) have node `id` as a voter at
/// `addr`; false when it cannot tell.
async fn voter_at(op: &Operator, id: u64, addr: &str) -> bool {
    match op.get_json::<ClusterView>("/v1/cluster").await {
        Ok(view) => {
            view.voters.contains(&id) && view.nodes.get(&id).map(String::as_str) == Some(addr)
        }
        Err(_) => false,
    }
}

/// Removes member `id`: from the voters if it is one, else from the learners.
async fn remove(op: &Operator, id: u64) -> Result<MembershipView> {
    let as_voter = format!("/v1/cluster/voters/{id}");
    let as_learner = format!("/v1/cluster/learners/{id}");
    for path in [as_voter, as_learner] {
        match change(op, Method::DELETE, &path, None).await? {
            Ok(view) => return Ok(view),
            Err(refused) if refused.status == StatusCode::NOT_FOUND => {}
            Err(refused) => {
                return Err(op.refused_error(refused))
                    .with_context(|| format!("removing node {id}"))
            }
        }
    }
    // Also what a removal asked again looks like once the first one was made (its answer
    // lost, or the next member given asked after it).
    Err(anyhow!(
        "node {id} is neither a voter nor a learner (if it was one, it is removed already)"
    ))
}

/// Sends a membership change (with `body` as JSON, if any), asking again while no leader
/// takes it ([`Operator::answer_retrying`]: each change names a state, so asking again changes
/// nothing more); the answer decoded, or the refusal.
async fn change<T: serde::de::DeserializeOwned>(
    op: &Operator,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<std::result::Result<T, Refused>> {
    let answer = op
        .answer_retrying(|| {
            let request = op.request(method.clone(), path);
            match &body {
                Some(body) => request.json(body),
                None => request,
            }
        })
        .await?;
    match answer {
        Ok(response) => Ok(Ok(response
            .json()
            .await
            .with_context(|| format!("decoding the answer to {method} {path}"))?)),
        Err(refused) => Ok(Err(refused)),
    }
}

fn print<T: serde::Serialize>(view: &T) -> Result<()> {
    output::line(serde_json::to_string_pretty(view)?)
}
