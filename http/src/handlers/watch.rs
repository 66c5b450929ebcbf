//! `GET /v1/watch`: long polls on the change feed. Any member answers from its own feed; a
//! linearizable (or lease) watch first waits until the member applied the leader's read index,
//! so that its answer covers every change committed before the request.

use axum::extract::State;
use meta_consensus::{Change, ChangeEvent};

use crate::error::ApiError;
use crate::extract::Query;
use crate::follower_read::ReplayedReadIndex;
use crate::request::WatchQuery;
use crate::response::{ChangeView, EventView, WatchPage};
use crate::state::AppState;

/// `GET /v1/watch?after=&datanode=&prefix=&limit=&wait_ms=&consistency=`.
pub async fn watch(
    State(state): State<AppState>,
    replayed: ReplayedReadIndex,
    Query(query): Query<WatchQuery>,
) -> Result<axum::Json<WatchPage>, ApiError> {
    let req = query.validate()?;
    let read_index = state
        .follower_reads
        .read_index_for(&state.node, req.consistency.into(), replayed)
        .await?;
    let batch = state
        .node
        .watch(req.after, read_index, req.filter, req.limit, req.wait)
        .await?;
    Ok(axum::Json(WatchPage {
        index: batch.index,
        events: batch.events.into_iter().map(view).collect(),
    }))
}

fn view(e: ChangeEvent) -> EventView {
    let change = match e.change {
        Change::DatanodeRegistered { id, addr, epoch } => ChangeView::DatanodeRegistered {
            datanode: id,
            addr,
            epoch,
        },
        Change::DatanodeRemoved {
            id,
            replicas_removed,
        } => ChangeView::DatanodeRemoved {
            datanode: id,
            replicas_removed,
        },
        Change::ReplicasRegistered { datanode, shards } => {
            ChangeView::ReplicasRegistered { datanode, shards }
        }
        Change::ReplicasRemoved { datanode, shards } => {
            ChangeView::ReplicasRemoved { datanode, shards }
        }
        Change::KvPut { key } => ChangeView::KvPut { key },
        Change::KvDeleted { key } => ChangeView::KvDeleted { key },
    };
    EventView {
        index: e.index,
        change,
    }
}
