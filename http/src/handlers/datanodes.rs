//! `/v1/datanodes...`: register, list, read and remove datanodes; register and deregister
//! their shard replicas, and end a full report by pruning what it left out; list a datanode's
//! shards; heartbeats, and `/v1/liveness`, which datanodes the leader heard from.

use axum::extract::State;
use meta_consensus::{Command, CommandResult, DatanodeInfo, Heartbeat, ShardReport};

use super::{listing_error, unexpected};
use crate::auth::{ClientTokenOnly, EPOCH_RAISE};
use crate::error::ApiError;
use crate::extract::{Id, Json, NoBody, NoQuery, Path, Query};
use crate::follower_read::ReplayedReadIndex;
use crate::request::{
    id_cursor_of, DeregisterQuery, EpochBody, LivenessQuery, PageQuery, ReadQuery,
    RegisterDatanodeBody, RegisterShardsBody,
};
use crate::response::{
    DatanodeList, DatanodeLivenessView, DatanodeRegistered, DatanodeRemoved, DatanodeView,
    HeartbeatRecorded, LivenessView, ShardPage, ShardsDeregistered, ShardsRegistered,
};
use crate::state::SharedState;
use crate::writer::Writer;

impl From<DatanodeInfo> for DatanodeView {
    fn from(d: DatanodeInfo) -> Self {
        DatanodeView {
            id: d.id,
            addr: d.addr,
            epoch: d.epoch,
            shards: d.shards,
            removing: d.removing,
        }
    }
}

/// `PUT /v1/datanodes/{id}` `{"addr":..}` (and `"min_epoch"`, which takes a separate member
/// token if the node has one): registers (again) with a new epoch.
pub async fn register(
    _: NoQuery,
    writer: Writer,
    client_only: Option<axum::Extension<ClientTokenOnly>>,
    Path(Id(id)): Path<Id>,
    Json(body): Json<RegisterDatanodeBody>,
) -> Result<axum::Json<DatanodeRegistered>, ApiError> {
    body.validate()?;
    if body.min_epoch.is_some() && client_only.is_some() {
        return Err(ClientTokenOnly::refusal(EPOCH_RAISE));
    }
    let written = writer.write(body.command(id)).await?;
    match written.result {
        CommandResult::DatanodeRegistered { id, epoch } => {
            Ok(axum::Json(DatanodeRegistered { id, epoch }))
        }
        CommandResult::RestoreUnderWay { claimed_at } => Err(restoring(claimed_at)),
        other => Err(unexpected(other)),
    }
}

/// The refusal of a datanode's registration, or of an unfenced drop, while a restore runs.
fn restoring(claimed_at: u64) -> ApiError {
    ApiError::Restoring(format!(
        "a restore into the cluster (claimed at index {claimed_at}) has not ended: datanodes \
         register, and drop replicas without an epoch, once it ends (one cut off part way \
         ends with `metaserver snapshot end-restore`, or is run again into fresh data dirs)"
    ))
}

/// `GET /v1/datanodes?after=&limit=`.
pub async fn list(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    Query(query): Query<PageQuery>,
    _: NoBody,
) -> Result<axum::Json<DatanodeList>, ApiError> {
    let (page, consistency) = query.validate()?;
    let after = page.after.as_deref();
    let result = state
        .node
        .datanodes(
            state.read_consistency(consistency, replayed).await?,
            after,
            page.limit,
        )
        .await
        .map_err(listing_error(after))?;
    Ok(axum::Json(DatanodeList {
        datanodes: result.items.into_iter().map(DatanodeView::from).collect(),
        next: result.next,
    }))
}

/// `GET /v1/datanodes/{id}`; 404 if unknown.
pub async fn get(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    Path(Id(id)): Path<Id>,
    Query(query): Query<ReadQuery>,
    _: NoBody,
) -> Result<axum::Json<DatanodeView>, ApiError> {
    let consistency = query.validate()?;
    match state
        .node
        .datanode(state.read_consistency(consistency, replayed).await?, id)
        .await?
    {
        Some(info) => Ok(axum::Json(info.into())),
        None => Err(unknown_datanode(id)),
    }
}

/// `DELETE /v1/datanodes/{id}`: drops it and its replicas; 404 if unknown.
///
/// In a cluster of version 3 the leader answers the removal with its first piece, and the rest
/// go to the log one piece after the other (`meta-consensus`'s `node/removal.rs`), each a write
/// of its own: a removal holds up other writes and reads no more than a storm batch does. The
/// pieces run in a task of their own, so a client that hangs up does not stop a removal half
/// way. One that fails half way (an error: no leader, a timeout) has dropped some of the
/// datanode's replicas and leaves it registered with the rest: sending it again finishes it. A
/// datanode that registers again while it is removed keeps its new incarnation, with the
/// replicas not yet dropped: 409 `conflict`; a removal sent again removes the new incarnation.
pub async fn remove(
    _: NoQuery,
    writer: Writer,
    Path(Id(id)): Path<Id>,
    _: NoBody,
) -> Result<axum::Json<DatanodeRemoved>, ApiError> {
    tokio::spawn(remove_in_pieces(writer, id))
        .await
        .map_err(|e| ApiError::Internal(format!("the removal of datanode {id} failed: {e}")))?
}

async fn remove_in_pieces(
    writer: Writer,
    id: u64,
) -> Result<axum::Json<DatanodeRemoved>, ApiError> {
    let mut written = writer.write(Command::RemoveDatanode { id }).await?;
    let mut replicas_removed = 0;
    let mut first = true;
    loop {
        // The incarnation whose removal goes on, if it does.
        let next = match written.result {
            CommandResult::DatanodeRemoved {
                existed: true,
                replicas_removed: n,
            } => {
                replicas_removed += n;
                None
            }
            CommandResult::RemovalPiece {
                removed,
                gone,
                registered_index,
            } => {
                replicas_removed += removed;
                (!gone).then_some(registered_index)
            }
            CommandResult::DatanodeRemoved { existed: false, .. }
            | CommandResult::UnknownDatanode { .. }
                if first =>
            {
                return Err(unknown_datanode(id))
            }
            // Removed by another removal since a piece of this one.
            CommandResult::UnknownDatanode { .. } => None,
            CommandResult::Fenced { current_epoch } => {
                return Err(ApiError::Conflict(format!(
                    "datanode {id} registered again (epoch {current_epoch}) while it was being \
                     removed, after {replicas_removed} of its replicas were: it stays registered; \
                     remove it again to remove the new incarnation"
                )))
            }
            other => return Err(unexpected(other)),
        };
        let Some(registered_index) = next else {
            return Ok(axum::Json(DatanodeRemoved {
                id,
                replicas_removed,
                index: written.index,
            }));
        };
        first = false;
        written = writer
            .write(Command::RemoveDatanodePiece {
                id,
                registered_index: Some(registered_index),
            })
            .await?;
    }
}

/// `POST /v1/datanodes/{id}/shards` `{"epoch":E,"shards":[..]}`: one batch, one log entry.
pub async fn register_shards(
    _: NoQuery,
    writer: Writer,
    Path(Id(id)): Path<Id>,
    Json(body): Json<RegisterShardsBody>,
) -> Result<axum::Json<ShardsRegistered>, ApiError> {
    body.validate()?;
    let epoch = body.epoch;
    let shards = body
        .shards
        .into_iter()
        .map(|s| ShardReport {
            id: s.id,
            generation: s.generation,
            size: s.size,
        })
        .collect();
    let written = writer
        .write(Command::RegisterShards {
            datanode: id,
            epoch,
            shards,
        })
        .await?;
    match written.result {
        CommandResult::ShardsRegistered {
            accepted,
            unchanged,
            stale,
        } => Ok(axum::Json(ShardsRegistered {
            accepted,
            unchanged,
            stale,
            index: written.index,
        })),
        other => Err(refused(id, epoch, other)),
    }
}

/// The error for a command of datanode `id`'s incarnation `epoch` that was not carried out.
fn refused(id: u64, epoch: u64, result: CommandResult) -> ApiError {
    match result {
        CommandResult::Fenced { current_epoch } => ApiError::Fenced {
            datanode: id,
            epoch,
            current_epoch,
            removing: false,
        },
        CommandResult::FencedForRemoval { current_epoch } => ApiError::Fenced {
            datanode: id,
            epoch,
            current_epoch,
            removing: true,
        },
        CommandResult::UnknownDatanode { id } => unknown_datanode(id),
        CommandResult::RestoreUnderWay { claimed_at } => restoring(claimed_at),
        other => unexpected(other),
    }
}

/// `DELETE /v1/datanodes/{id}/shards/{shard}?epoch=E`; 404 if the replica is not registered.
/// With `epoch`, 409 `fenced` when `E` is not the datanode's current epoch: a former
/// incarnation's late (or retried) deregistration cannot drop a replica the current one
/// registered. A datanode should always send it; without it the replica is dropped whichever
/// incarnation asks.
pub async fn deregister_shard(
    Query(query): Query<DeregisterQuery>,
    writer: Writer,
    Path((Id(id), Id(shard))): Path<(Id, Id)>,
    _: NoBody,
) -> Result<axum::Json<ShardsDeregistered>, ApiError> {
    let epoch = query.epoch()?;
    let command = match epoch {
        Some(epoch) => Command::DeregisterShardsOf {
            datanode: id,
            epoch,
            shards: vec![shard],
        },
        None => Command::DeregisterShards {
            datanode: id,
            shards: vec![shard],
        },
    };
    let written = writer.write(command).await?;
    match written.result {
        CommandResult::ShardsDeregistered { removed: 0 } => Err(ApiError::NotFound(format!(
            "datanode {id} holds no replica of shard {shard}"
        ))),
        CommandResult::ShardsDeregistered { removed } => Ok(axum::Json(ShardsDeregistered {
            removed,
            index: written.index,
        })),
        other => Err(refused(id, epoch.unwrap_or_default(), other)),
    }
}

/// `POST /v1/datanodes/{id}/prune` `{"epoch":E}`: the batches of incarnation `E` were all the
/// datanode holds; drops its replicas that none of them registered. 409 `fenced` when `E` is
/// not its current epoch, 404 if it is unknown.
///
/// The prune goes to the log in pieces of bounded work, one after the other, so that a
/// datanode's prune holds up other writes and reads no more than one of its batches does. A
/// prune that fails part way (or is fenced by a new incarnation) has dropped only replicas
/// that no later report of the same incarnation could have kept: sending it again is safe.
pub async fn prune(
    _: NoQuery,
    writer: Writer,
    Path(Id(id)): Path<Id>,
    Json(body): Json<EpochBody>,
) -> Result<axum::Json<ShardsDeregistered>, ApiError> {
    let epoch = body.epoch;
    let (mut removed, mut from_bucket) = (0, 0);
    loop {
        let written = writer
            .write(Command::PruneReplicas {
                datanode: id,
                epoch,
                from_bucket,
            })
            .await?;
        match written.result {
            CommandResult::Pruned { removed: n, next } => {
                removed += n;
                match next {
                    Some(next) => from_bucket = next,
                    None => {
                        return Ok(axum::Json(ShardsDeregistered {
                            removed,
                            index: written.index,
                        }))
                    }
                }
            }
            other => return Err(refused(id, epoch, other)),
        }
    }
}

/// `POST /v1/datanodes/{id}/heartbeat` `{"epoch":E}`: the datanode's incarnation `E` is alive.
/// Answered by the leader (a follower replays it there); 409 `fenced` when `E` is not its
/// current epoch (it must register again and report its shards), 404 if it is unknown.
pub async fn heartbeat(
    _: NoQuery,
    State(state): State<SharedState>,
    Path(Id(id)): Path<Id>,
    Json(body): Json<EpochBody>,
) -> Result<axum::Json<HeartbeatRecorded>, ApiError> {
    let epoch = body.epoch;
    match state.node.heartbeat(id, epoch).await? {
        Heartbeat::Recorded { timeout } => Ok(axum::Json(HeartbeatRecorded {
            timeout_ms: millis(timeout),
        })),
        Heartbeat::Fenced {
            current_epoch,
            removing,
        } => Err(ApiError::Fenced {
            datanode: id,
            epoch,
            current_epoch,
            removing,
        }),
        Heartbeat::UnknownDatanode => Err(unknown_datanode(id)),
    }
}

/// `GET /v1/liveness` (`?state=&after=&limit=`): registered datanodes with their liveness, or
/// those in one state, a page at a time by id; answered by the leader.
pub async fn liveness(
    State(state): State<SharedState>,
    Query(query): Query<LivenessQuery>,
    _: NoBody,
) -> Result<axum::Json<LivenessView>, ApiError> {
    let (wanted, after, limit) = query.validate()?;
    let report = state.node.liveness_page(wanted, after, limit).await?;
    let datanodes: Vec<DatanodeLivenessView> = report
        .datanodes
        .into_iter()
        .map(|(d, l)| DatanodeLivenessView {
            id: d.id,
            addr: d.addr,
            epoch: d.epoch,
            shards: d.shards,
            state: l.state.name().into(),
            heard_ms_ago: l.heard_ago.map(millis),
            removing: d.removing,
        })
        .collect();
    let next = report.next.map(id_cursor_of);
    Ok(axum::Json(LivenessView {
        leader_id: report.leader,
        timeout_ms: millis(report.timeout),
        collecting_ms: millis(report.collecting),
        datanodes,
        next,
    }))
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `GET /v1/datanodes/{id}/shards?after=&limit=`; 404 if the datanode is unknown.
pub async fn list_shards(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    Path(Id(id)): Path<Id>,
    Query(query): Query<PageQuery>,
    _: NoBody,
) -> Result<axum::Json<ShardPage>, ApiError> {
    let (page, consistency) = query.validate()?;
    let after = page.after.as_deref();
    let result = state
        .node
        .datanode_shards(
            state.read_consistency(consistency, replayed).await?,
            id,
            after,
            page.limit,
        )
        .await
        .map_err(listing_error(after))?;
    if result.items.is_empty() {
        // An empty page: tell an unknown datanode from one without shards (also on a later
        // page: one removed while it was listed is not a list that ended).
        let known = state
            .node
            .datanode(meta_consensus::Consistency::Local, id)
            .await?
            .is_some();
        if !known {
            return Err(unknown_datanode(id));
        }
    }
    Ok(axum::Json(ShardPage {
        shards: result.items.into_iter().map(Into::into).collect(),
        next: result.next,
    }))
}

fn unknown_datanode(id: u64) -> ApiError {
    ApiError::NotFound(format!("datanode {id} is not registered"))
}
