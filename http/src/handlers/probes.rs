//! `/healthz`, `/readyz` and `/metrics`: open without a token.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use meta_consensus::Consistency;

use crate::error::{error_response, ApiError};
use crate::extract::{NoBody, NoQuery};
use crate::follower_read::ReplayedReadIndex;
use crate::response::HealthView;
use crate::state::{Readiness, SharedState};

/// Content type of the OpenMetrics text format that `/metrics` answers in.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /healthz`: the process serves. The probes take no query string: one is refused (400
/// `invalid_query`) like on every other route that takes none.
pub async fn healthz(_: NoQuery, _: NoBody) -> axum::Json<HealthView> {
    axum::Json(HealthView {
        status: "ok".into(),
    })
}

/// How long `/readyz` takes at most on a node that is not known to have caught up: probes'
/// own timeouts are often a second (Kubernetes' default), and one that times out says less
/// than a 503 that says why.
const PROBE_BUDGET: std::time::Duration = std::time::Duration::from_millis(900);

/// Of that, how long it waits for the leader's commit index: a leader that has not given it by
/// then is paused, cut off or gone (the rest waits for this node to apply up to it, which one
/// that applies what the leader committed as fast as it comes does in milliseconds).
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// `GET /readyz`: 200 once a member with a known leader that has caught up, else 503
/// `not_ready` saying what it waits for.
pub async fn readyz(State(state): State<SharedState>, _: NoQuery, _: NoBody) -> Response {
    let mut status = state.node.status();
    let mut leader_index = None;
    if !state.readiness.caught_up() && Readiness::member_with_leader(&status).is_ok() {
        let started = std::time::Instant::now();
        // What the node must apply to serve what the cluster acknowledged: the leader's
        // commit index (its lease is enough: this is a probe, not a read).
        let asked = state.follower_reads.read_index_for(
            &state.node,
            Consistency::Lease,
            ReplayedReadIndex(None),
        );
        match tokio::time::timeout(LEADER_WAIT, asked).await {
            Ok(Ok(index)) => leader_index = Some(index),
            Ok(Err(e)) => {
                let why = format!("no commit index from the leader: {e}");
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", why);
            }
            Err(_) => {
                let why = format!(
                    "no commit index from the leader within {} ms (it may be paused, or cut \
                     off from this node)",
                    LEADER_WAIT.as_millis()
                );
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", why);
            }
        }
        // Under writes a caught-up follower applies a few entries behind the index it was
        // just told, as a follower read waits for: it gets a moment to apply them, rather
        // than be found behind by every first probe. One far behind is not ready yet.
        if let Some(index) = leader_index {
            let left = PROBE_BUDGET.saturating_sub(started.elapsed());
            let _ = state.node.wait_applied(index, left).await;
            status = state.node.status();
        }
    }
    match state.readiness.check(&status, leader_index) {
        Ok(()) => axum::Json(HealthView {
            status: "ok".into(),
        })
        .into_response(),
        Err(waiting) => error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", waiting),
    }
}

/// `GET /metrics`: Prometheus (OpenMetrics) text.
pub async fn metrics(
    State(state): State<SharedState>,
    _: NoQuery,
    _: NoBody,
) -> Result<Response, ApiError> {
    let text = state
        .metrics
        .encode()
        .map_err(|e| ApiError::Internal(format!("encoding metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response())
}
