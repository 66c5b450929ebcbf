//! `GET /v1/watch`: long polls on the change feed. Any member answers from its own feed; a
//! linearizable (or lease) watch first waits until the member applied the leader's read index,
//! so that its answer covers every change committed before the request. A member lets a
//! bounded number of watches wait at once (`AppState::watch_slots`), so that watchers cannot
//! take every connection slot from the datanodes.

use axum::extract::State;
use axum::Extension;
use meta_consensus::{Change, ChangeBatch, ChangeEvent};

use crate::error::ApiError;
use crate::extract::{NoBody, Query};
use crate::follower_read::ReplayedReadIndex;
use crate::hangup::Hangup;
use crate::request::{WatchQuery, WatchRequest};
use crate::response::{ChangeView, EventView, WatchPage};
use crate::state::SharedState;

/// `GET /v1/watch?after=&history=&datanode=&prefix=&limit=&wait_ms=&consistency=`.
pub async fn watch(
    State(state): State<SharedState>,
    Query(query): Query<WatchQuery>,
    hangup: Option<Extension<Hangup>>,
    _: NoBody,
) -> Result<axum::Json<WatchPage>, ApiError> {
    // The wait counts from the request's arrival: asking the leader for its read index is part
    // of it, and so is waiting for the next leader when none answers (below), so that
    // a long poll never outlasts what its client (or a proxy) waits for.
    let arrived = tokio::time::Instant::now();
    let req = query.validate()?;
    let history = state.node.history_name();
    super::check_history(
        &state.node,
        req.history.as_deref(),
        "indexes",
        "read the state again and watch from a fresh index",
    )?;
    // Changes this member no longer keeps are gone whatever the leader says.
    if let Some(after) = req.after {
        state.node.check_watch_from(after)?;
    }
    // Only a watch that may wait holds a slot; one that answers at once needs none.
    let _slot = if req.wait.is_zero() || req.after.is_none() {
        None
    } else {
        let slot = state.watch_slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::Overloaded(
                "too many watches are waiting on this member; retry in a moment, or at \
                 another member"
                    .into(),
            )
        })?;
        Some((slot, state.metrics.watch_slot_taken()))
    };
    // A long poll whose client went away stops waiting, so that its slots go back at once
    // (`hangup.rs`). Its page claims no change: its index is the one the client asked from,
    // which a client that only closed its sending side reads and asks from again.
    let long_poll = req.after.is_some() && !req.wait.is_zero();
    let hung_up = async {
        match &hangup {
            Some(Extension(hangup)) if long_poll => hangup.closed().await,
            _ => std::future::pending().await,
        }
    };
    let after = req.after.unwrap_or_default();
    let batch = tokio::select! {
        batch = changes(&state, req, arrived) => batch?,
        () = hung_up => {
            // Only an index this member applied is known to be the cluster's; one past it (a
            // member ahead handed it out, or another cluster did) is checked with the
            // leader's read index, which the early answer does not wait for.
            if after > state.node.feed_applied() {
                return Err(ApiError::Unavailable(format!(
                    "the client closed its side before this member could check after={after} \
                     against the cluster's newest index; ask again"
                )));
            }
            ChangeBatch {
                events: Vec::new(),
                index: after,
            }
        }
    };
    Ok(axum::Json(WatchPage {
        index: batch.index,
        history,
        events: batch.events.into_iter().map(view).collect(),
    }))
}

/// The page a watch answers: waits for the read index (see [`watch`]), then for changes.
async fn changes(
    state: &SharedState,
    req: WatchRequest,
    arrived: tokio::time::Instant,
) -> Result<ChangeBatch, ApiError> {
    // Watches are never replayed at the leader: a read index in the request's headers is not
    // ours, and is not trusted. A node that begins to close answers at once: a long poll with
    // what this member applied (the page's index says how far that covers), a start with 503.
    // A long poll whose wait runs out before the leader answers does the same.
    // A long poll that finds no leader waits for the next one within its wait (not the
    // failover's deadline, which may be longer), then answers what this member applied.
    let long_poll = req.after.is_some() && !req.wait.is_zero();
    let until = arrived + req.wait;
    let read_index = loop {
        let (asked_of, term) = state.node.known_leader_and_term();
        let read_index = state.follower_reads.read_index_for(
            &state.node,
            req.consistency.into(),
            ReplayedReadIndex(None),
        );
        let got = tokio::select! {
            read_index = read_index => read_index,
            // A start answers within its wait too (a member that knows no leader would take
            // the whole request timeout), but it has no events to answer with.
            _ = tokio::time::sleep_until(until), if !req.wait.is_zero() => match req.after {
                Some(_) => break 0,
                None => {
                    return Err(ApiError::Timeout(format!(
                        "no read index to start from came within wait_ms ({} ms): this member \
                         knows no leader, or its leader did not answer in time; retry, or ask \
                         another member",
                        req.wait.as_millis()
                    )))
                }
            },
            _ = state.node.closing() => match req.after {
                Some(_) => break 0,
                None => return Err(meta_consensus::Error::Shutdown.into()),
            },
        };
        match got {
            Ok(index) => break index,
            Err(ApiError::NoLeader(_)) if long_poll && state.node.in_cluster() => {
                tokio::select! {
                    next = state.node.leader_after(asked_of, term) => match next {
                        Some(_) => continue,
                        None => break 0,
                    },
                    _ = tokio::time::sleep_until(until) => break 0,
                    _ = state.node.closing() => break 0,
                }
            }
            Err(e) => return Err(e),
        }
    };
    // A long poll stays one (at least a moment's wait), so a member behind the read index
    // answers what it has rather than taking the whole request timeout to catch up.
    let wait = match long_poll {
        false => req.wait,
        true => req
            .wait
            .saturating_sub(arrived.elapsed())
            .max(std::time::Duration::from_millis(1)),
    };
    state
        .node
        .watch(req.after, read_index, req.filter, req.limit, wait)
        .await
        .map_err(ApiError::from)
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
