//! `/v1/cluster...` and `/v1/config`: status, membership, snapshots and runtime settings.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use meta_consensus::{ClusterStatus, Command, CommandResult, Node, RestoreOrigin, Role};

use super::unexpected;
use crate::error::ApiError;
use crate::extract::{Id, Json, NoBody, NoQuery, Path, Query};
use crate::follower_read::ReplayedReadIndex;
use crate::request::{
    validate_addr, AddLearnerBody, ChangeAddressBody, ChangeVotersBody, ConfigPatchBody,
    EpochFloorBody, InitBody, ReadQuery, SetLeaderBody,
};
use crate::response::{
    ClusterView, ConfigView, EpochFloorView, LeaderView, MembershipView, RejoinView,
    RemovedFromView, ReplicationView, RestoreEndedView, RestoreView, SnapshotView, WalView,
};
use crate::state::{AppState, SharedState};
use crate::writer::Writer;

/// The role's name in the API.
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Leader => "leader",
        Role::LeaderWithoutQuorum => "leader_without_quorum",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Learner => "learner",
        Role::Uninitialized => "uninitialized",
        Role::Removed => "removed",
        Role::Shutdown => "shutdown",
    }
}

impl From<ClusterStatus> for ClusterView {
    fn from(s: ClusterStatus) -> Self {
        let snapshot = s.snapshot_index.map(|index| SnapshotView {
            index,
            bytes: s.snapshot_bytes.unwrap_or(0),
        });
        ClusterView {
            id: s.id,
            role: role_name(s.role).to_owned(),
            leader_id: s.leader_id,
            leader_addr: s.leader_addr,
            term: s.term,
            voters: s.voters,
            joint: joint(s.voter_sets),
            learners: s.learners,
            nodes: s.nodes,
            last_log_index: s.last_log_index.unwrap_or(0),
            committed: s.committed.unwrap_or(0),
            applied: s.applied.unwrap_or(0),
            purged: s.purged.unwrap_or(0),
            snapshot,
            wal: WalView {
                appends: s.wal.appends,
                barriers: s.wal.barriers,
                appends_per_barrier: if s.wal.barriers == 0 {
                    0.0
                } else {
                    s.wal.appends as f64 / s.wal.barriers as f64
                },
            },
            datanodes: s.datanodes,
            replicas: s.replicas,
            replication: s
                .replication
                .into_iter()
                .filter(|r| r.node != s.id)
                .map(|r| {
                    let view = ReplicationView {
                        matched: r.matched,
                        lag: r.lag,
                        heard_ms: r.heard_ms,
                        snapshot_refused: r.snapshot_refused,
                    };
                    (r.node, view)
                })
                .collect(),
            cluster_version: s.cluster_version,
            build_version: s.build_version,
            epoch_floor: s.epoch_floor,
            restore: s.restore.map(RestoreView::from),
            member_versions: s.member_versions,
            data_dir_free_bytes: s.data_dir_free_bytes,
            min_free_bytes: s.min_free_bytes,
            rejoin: s.rejoin.map(|r| RejoinView {
                term_floor: r.term_floor,
                waiting: r.waiting,
                knows_cluster: r.knows_cluster,
            }),
            removed_from: s.removal.map(|r| RemovedFromView {
                membership_index: r.membership_index,
                members: r.members,
            }),
            refused_by: s.refused_by,
            token_refused_by: s.token_refused_by,
            stopping: s.stopping,
            snapshot_refused: s.snapshot_refused,
            tls_files_refused: None,
        }
    }
}

/// `GET /v1/cluster`: this node's view.
pub async fn status(
    _: NoQuery,
    State(state): State<SharedState>,
    _: NoBody,
) -> axum::Json<ClusterView> {
    let mut view = ClusterView::from(state.node.status());
    view.tls_files_refused = state.metrics.connections().tls_refusal();
    axum::Json(view)
}

fn membership(state: &AppState) -> MembershipView {
    let status = state.node.status();
    MembershipView {
        voters: status.voters,
        joint: joint(status.voter_sets),
        learners: status.learners,
    }
}

/// The voter sets of a half-done voter change, `None` when there is one set.
fn joint(sets: Vec<Vec<u64>>) -> Option<Vec<Vec<u64>>> {
    (sets.len() > 1).then_some(sets)
}

/// `POST /v1/cluster/init` `{"members":{"1":"host:port",..}}`: only on a never-initialized
/// node (409 `already_initialized` otherwise). Never forwarded.
pub async fn init(
    _: NoQuery,
    State(state): State<SharedState>,
    Json(body): Json<InitBody>,
) -> Result<axum::Json<MembershipView>, ApiError> {
    body.validate()?;
    // Before the list is checked against this node and the members are asked: an initialized
    // node's answer is that (a list that does not name it, sent to the wrong member, would
    // name another cause), and it asks no address a request names.
    if state.node.is_initialized().await? {
        return Err(meta_consensus::Error::AlreadyInitialized.into());
    }
    body.validate_names(state.node.id(), state.node.addr())?;
    state
        .member_link()
        .check_init_members(state.node.id(), &body.members)
        .await?;
    let voters: Vec<u64> = body.members.keys().copied().collect();
    let members: BTreeMap<u64, Node> = body
        .members
        .into_iter()
        .map(|(id, addr)| (id, Node::new(addr)))
        .collect();
    state.node.initialize(members).await?;
    Ok(axum::Json(MembershipView {
        voters,
        joint: None,
        learners: Vec::new(),
    }))
}

/// `POST /v1/cluster/learners` `{"id":..,"addr":..}`: returns once the change is committed.
pub async fn add_learner(
    _: NoQuery,
    State(state): State<SharedState>,
    Json(body): Json<AddLearnerBody>,
) -> Result<axum::Json<MembershipView>, ApiError> {
    body.validate()?;
    // A voter, or an address a member has, is refused before the probe: the process there
    // would answer as that member, and the refusal would name the wrong cause.
    state.node.check_learner(body.id, &body.addr)?;
    // A node of another cluster, or another node at that address, would refuse every message
    // once added: say so now. A build older than the cluster's version is not added: it
    // refuses here, before it takes this cluster's id, and `MetaNode::add_learner` checks too.
    // What was heard of this id before is not this node's answer (another process with the id,
    // at another address, may have answered a moment ago): forgotten when this one did not say.
    let cluster_version = state.node.cluster_version();
    let link = state.member_link();
    match link.probe(body.id, &body.addr, cluster_version).await? {
        Some(version) => state.node.config().peer_versions.note(body.id, version),
        None => state.node.config().peer_versions.forget(body.id),
    }
    state
        .node
        .add_learner(body.id, Node::new(body.addr))
        .await?;
    Ok(axum::Json(membership(&state)))
}

/// `DELETE /v1/cluster/learners/{id}`: removes a learner (409 for a voter, 404 for neither);
/// returns once the change is committed.
pub async fn remove_learner(
    _: NoQuery,
    State(state): State<SharedState>,
    Path(Id(id)): Path<Id>,
    _: NoBody,
) -> Result<axum::Json<MembershipView>, ApiError> {
    // The removed learner is told by the leader (`removal_notices.rs`).
    state.node.remove_learner(id).await?;
    Ok(axum::Json(membership(&state)))
}

/// `PUT /v1/cluster/members/{id}` `{"addr":"host:port"}`: moves a member to a new address
/// (it was restarted there; a member asks for this itself, see the binary's `relocation.rs`).
/// Node `id` of this cluster, holding its data, must answer at the new address, and no longer
/// at its old one unless the same process answers at both (another name for its host, on the
/// same port) (409 otherwise): two processes answering for one member could vote twice in a
/// term. An id the membership does not name is 404, before either address is asked. Returns
/// once the change is committed.
pub async fn change_address(
    _: NoQuery,
    State(state): State<SharedState>,
    Path(Id(id)): Path<Id>,
    Json(body): Json<ChangeAddressBody>,
) -> Result<axum::Json<MembershipView>, ApiError> {
    validate_addr(&body.addr)?;
    // The leader's membership first: a follower forwards at once, and an id that is no member
    // is refused before anything is asked of the address the request names.
    let old = state.node.member_address(id)?;
    let link = state.member_link();
    let moved = link.confirm(id, &body.addr).await?;
    if old != body.addr {
        match link.answers_as(id, &old).await {
            Some(there) if !there.same_process(moved) => {
                return Err(ApiError::Conflict(format!(
                    "node {id} still answers at its old address {old}, as another process \
                     than the one at {}: stop it there first (two processes answering for one \
                     member could vote twice)",
                    body.addr
                )));
            }
            // Nothing answers there as node `id`, or the one process answers at both.
            _ => {}
        }
    }
    state.node.change_address(id, body.addr).await?;
    Ok(axum::Json(membership(&state)))
}

/// `PUT /v1/cluster/voters` `{"voters":[..]}`: each new voter must be a learner that is
/// reachable and caught up (409 otherwise); voters left out leave the cluster.
pub async fn change_voters(
    _: NoQuery,
    State(state): State<SharedState>,
    Json(body): Json<ChangeVotersBody>,
) -> Result<axum::Json<MembershipView>, ApiError> {
    let voters = body.validate()?;
    // The nodes left out are told by the leader (`removal_notices.rs`).
    state.node.change_voters(voters).await?;
    Ok(axum::Json(membership(&state)))
}

/// `PUT /v1/cluster/voters/{id}`: makes learner `id` a voter too, the other voters staying (the
/// leader computes the set, so two such requests at once both count); checked as
/// `PUT /v1/cluster/voters` is. No change if it is a voter already.
pub async fn add_voter(
    _: NoQuery,
    State(state): State<SharedState>,
    Path(Id(id)): Path<Id>,
    _: NoBody,
) -> Result<axum::Json<MembershipView>, ApiError> {
    state.node.add_voter(id).await?;
    Ok(axum::Json(membership(&state)))
}

/// `DELETE /v1/cluster/voters/{id}`: voter `id` leaves the cluster, the other voters staying
/// (404 if it is not a voter, 409 if it is the only one, or if the others lack an answering
/// majority).
pub async fn remove_voter(
    _: NoQuery,
    State(state): State<SharedState>,
    Path(Id(id)): Path<Id>,
    _: NoBody,
) -> Result<axum::Json<MembershipView>, ApiError> {
    // The removed voter is told by the leader (`removal_notices.rs`).
    state.node.remove_voter(id).await?;
    Ok(axum::Json(membership(&state)))
}

/// `PUT /v1/cluster/leader` `{"id":N}`: moves the leadership to voter N, which must answer the
/// leader and hold its log (409 otherwise); answers once N leads.
pub async fn set_leader(
    _: NoQuery,
    State(state): State<SharedState>,
    Json(body): Json<SetLeaderBody>,
) -> Result<axum::Json<LeaderView>, ApiError> {
    let to = body.validate()?;
    // Not to a voter short of disk: it would refuse the writes (and hand the leadership on).
    // Checked by the leader only (a follower sends the request on to it), which knows its
    // own room and asks another voter for its; also one elected a moment ago, which no
    // quorum acknowledged yet (the check was skipped then, and a voter short of disk led).
    let status = state.node.status();
    if matches!(status.role, Role::Leader | Role::LeaderWithoutQuorum) {
        // What is refused without a wait is refused before the target is asked for its room
        // (a paused target keeps that question waiting for its timeout).
        state.node.transfer_view(to)?;
        let room = match status.nodes.get(&to) {
            _ if to == status.id => Some(crate::disk_handover::Room {
                id: to,
                free: status.data_dir_free_bytes,
                reserve: status.min_free_bytes,
                stopping: status.stopping,
            }),
            Some(addr) => Some(crate::disk_handover::ask_room(&state, to, addr).await),
            None => None,
        };
        if room.is_some_and(|r| r.stopping) {
            return Err(ApiError::Conflict(format!(
                "node {to} is stopping: it would close right after taking the leadership"
            )));
        }
        if let Some(room) = room.filter(crate::disk_handover::Room::short) {
            return Err(ApiError::Conflict(format!(
                "node {to} is short of disk ({} bytes free, below its --min-free-bytes {}): as \
                 leader it would refuse every write that adds data",
                room.free.unwrap_or(0),
                room.reserve
            )));
        }
    }
    let (leader, term) = state.node.transfer_leadership(to).await?;
    Ok(axum::Json(LeaderView { leader, term }))
}

/// `PUT /v1/cluster/epoch-floor` `{"at_least": N}`: raises the cluster's epoch floor to N
/// (never lowers it); every registration from then on gets an epoch of at least the floor. A
/// restore raises it above every epoch of the cluster it replaces. Needs cluster version 4:
/// refused with 503 `cluster_version` while a member runs an older build. With `"if_fresh":
/// true` (a restore's claim, cluster version 6) it raises the floor only in a fresh cluster (no
/// datanode, no key, a floor never raised), else answers 409 `conflict` naming what the cluster
/// holds: of two restores run at once, the second is refused before it writes anything. With
/// `"restore"` it marks the cluster as being restored (version 8), and with `"hold_keys":true`
/// it also holds keys back until the restore ends (version 9).
pub async fn raise_epoch_floor(
    _: NoQuery,
    writer: Writer,
    Json(body): Json<EpochFloorBody>,
) -> Result<axum::Json<EpochFloorView>, ApiError> {
    let at_least = body.validate()?;
    let command = match (body.if_fresh, body.restore) {
        (true, Some(r)) => {
            let origin = RestoreOrigin {
                index: r.index,
                datanodes: r.datanodes,
                replicas: r.replicas,
                keys: r.keys,
            };
            match body.hold_keys {
                true => Command::BeginRestoreHoldingKeys { at_least, origin },
                false => Command::BeginRestore { at_least, origin },
            }
        }
        (true, None) => Command::ClaimForRestore { at_least },
        (false, _) => Command::RaiseEpochFloor { at_least },
    };
    let written = writer.write(command).await?;
    match written.result {
        CommandResult::EpochFloor { floor } => {
            Ok(axum::Json(EpochFloorView { epoch_floor: floor }))
        }
        CommandResult::NotFresh {
            floor,
            datanodes,
            keys,
        } => Err(ApiError::Conflict(not_fresh(floor, datanodes, keys))),
        other => Err(unexpected(other)),
    }
}

/// `DELETE /v1/cluster/restore`: ends the restore the cluster's mark names (a restore's last
/// step, once everything it replays is written; an operator's, for a restore cut off whose
/// partial state is to be kept). Answers the mark it removed, `null` when there was none.
/// Needs cluster version 8: 503 `cluster_version` while a member runs an older build.
pub async fn end_restore(
    _: NoQuery,
    writer: Writer,
    _: NoBody,
) -> Result<axum::Json<RestoreEndedView>, ApiError> {
    let written = writer.write(Command::EndRestore).await?;
    match written.result {
        CommandResult::RestoreEnded { ended } => Ok(axum::Json(RestoreEndedView {
            ended: ended.map(RestoreView::from),
        })),
        other => Err(unexpected(other)),
    }
}

/// The refusal of a restore's claim on a cluster that is not fresh: what it holds (its epoch
/// floor, 0 if never raised). A restore reads it to tell its own claim, made by an attempt
/// whose answer was lost, from another's.
pub fn not_fresh(floor: u64, datanodes: bool, keys: bool) -> String {
    let mut holds = Vec::new();
    if datanodes {
        holds.push("datanodes".to_owned());
    }
    if keys {
        holds.push("keys".to_owned());
    }
    if floor > 0 {
        holds.push(format!(
            "an epoch floor raised to {floor} (a restore began or ran here)"
        ));
    }
    format!(
        "the cluster is not fresh: it holds {}; a restore goes only into a fresh cluster (start \
         it on fresh data dirs)",
        holds.join(" and ")
    )
}

/// `POST /v1/cluster/snapshot`: builds a snapshot now, answers once it is durable.
pub async fn build_snapshot(
    State(state): State<SharedState>,
    Query(query): Query<ReadQuery>,
    _: NoBody,
) -> Result<axum::Json<SnapshotView>, ApiError> {
    // A member behind the leader (restarted, catching up) would build, and a backup taken
    // from it would miss, writes acknowledged before the request: it first applies the
    // leader's read index, unless asked for its state as it is (`consistency=local`, e.g.
    // to save what there is while the cluster has no quorum).
    let consistency = query.validate()?;
    let index = state
        .follower_reads
        .read_index_for(&state.node, consistency.into(), ReplayedReadIndex(None))
        .await?;
    state
        .node
        .wait_applied(index, state.node.config().request_timeout)
        .await?;
    let info = state.node.snapshot_now().await?;
    Ok(axum::Json(SnapshotView {
        index: info.index,
        bytes: info.bytes,
    }))
}

/// `GET /v1/cluster/snapshot`: streams the newest snapshot file (a backup), paced by the
/// snapshot rate; 404 if none.
pub async fn download_snapshot(
    _: NoQuery,
    State(state): State<SharedState>,
    _: NoBody,
) -> Result<Response, ApiError> {
    let missing = || ApiError::NotFound("this node has no snapshot yet".into());
    // Retention may delete the file between asking for it and opening it (a newer snapshot
    // replaced it); then the newer one is served. Once open, a file stays readable.
    let mut path = state.node.newest_snapshot_file().ok_or_else(missing)?;
    let mut attempts = 0;
    let file = loop {
        match tokio::fs::File::open(&path).await {
            Ok(file) => break file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                attempts += 1;
                let newer = state.node.newest_snapshot_file().ok_or_else(missing)?;
                if newer == path || attempts > 3 {
                    return Err(missing());
                }
                path = newer;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                return Err(ApiError::Overloaded(
                    "this node has no file descriptor free to open its snapshot; retry after a \
                     pause"
                        .into(),
                ))
            }
            Err(e) => {
                return Err(ApiError::Internal(format!(
                    "opening snapshot {}: {e}",
                    path.display()
                )))
            }
        }
    };
    let len = file
        .metadata()
        .await
        .map_err(|e| ApiError::Internal(format!("reading snapshot {}: {e}", path.display())))?
        .len();
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("snapshot")
        .to_owned();
    // Paced like an export, sharing its budget, so that a backup does not compete with the
    // log's fsyncs for the disk at more than the rate the operator set.
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        state.node.paced_snapshot_reader(file),
        256 * 1024,
    ));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        body,
    )
        .into_response())
}

/// `GET /v1/config`: this node's runtime settings.
pub async fn get_config(
    _: NoQuery,
    State(state): State<SharedState>,
    _: NoBody,
) -> axum::Json<ConfigView> {
    axum::Json(ConfigView {
        snapshot_max_bytes_per_sec: state.node.snapshot_rate(),
    })
}

/// `PATCH /v1/config` `{"snapshot_max_bytes_per_sec":N}`: applied to this node at once.
pub async fn patch_config(
    _: NoQuery,
    State(state): State<SharedState>,
    Json(body): Json<ConfigPatchBody>,
) -> axum::Json<ConfigView> {
    if let Some(rate) = body.snapshot_max_bytes_per_sec {
        tracing::info!(rate, "snapshot rate changed");
        state.node.set_snapshot_rate(rate);
    }
    axum::Json(ConfigView {
        snapshot_max_bytes_per_sec: state.node.snapshot_rate(),
    })
}
