//! `/v1/shards...`: all replicas by shard, and one shard's replica set.

use axum::extract::State;

use super::listing_error;
use crate::error::ApiError;
use crate::extract::{Id, NoBody, Path, Query};
use crate::follower_read::ReplayedReadIndex;
use crate::request::{PageQuery, ReadQuery};
use crate::response::{ReplicaView, ShardPage, ShardView};
use crate::state::SharedState;

/// `GET /v1/shards?after=&limit=`.
pub async fn list(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    Query(query): Query<PageQuery>,
    _: NoBody,
) -> Result<axum::Json<ShardPage>, ApiError> {
    let (page, consistency) = query.validate()?;
    let after = page.after.as_deref();
    let result = state
        .node
        .shards(
            state.read_consistency(consistency, replayed).await?,
            after,
            page.limit,
        )
        .await
        .map_err(listing_error(after))?;
    Ok(axum::Json(ShardPage {
        shards: result.items.into_iter().map(Into::into).collect(),
        next: result.next,
    }))
}

/// `GET /v1/shards/{id}`; 404 if no datanode holds it.
pub async fn get(
    State(state): State<SharedState>,
    replayed: ReplayedReadIndex,
    Path(Id(id)): Path<Id>,
    Query(query): Query<ReadQuery>,
    _: NoBody,
) -> Result<axum::Json<ShardView>, ApiError> {
    let consistency = query.validate()?;
    match state
        .node
        .shard(state.read_consistency(consistency, replayed).await?, id)
        .await?
    {
        Some(info) => Ok(axum::Json(ShardView {
            id: info.id,
            replicas: info
                .replicas
                .into_iter()
                .map(|r| ReplicaView {
                    datanode: r.datanode,
                    generation: r.generation,
                    size: r.size,
                })
                .collect(),
        })),
        None => Err(ApiError::NotFound(format!(
            "shard {id} has no registered replica"
        ))),
    }
}
