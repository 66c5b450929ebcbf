//! The whole HTTP surface of a node: the admin API, the probes and metrics, and the Raft
//! routes, with authentication, forwarding, metrics and the JSON fallbacks wired in.

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{any, get, post, put};
use axum::Router;

use crate::answer_budget;
use crate::auth::require_token;
use crate::bounded_body::bounded_raft_body;
use crate::cluster_identity::{self, check_cluster, check_member, PATH_IDENTITY};
use crate::disk_alarm::{self, PATH_ROOM};
use crate::extract::{method_not_allowed, not_found};
use crate::follower_read::{self, PATH_READ_INDEX};
use crate::forward::forward_to_leader;
use crate::forward_batch::{self, PATH_FORWARD_BATCH};
use crate::handlers::{cluster, datanodes, kv, probes, shards, watch};
use crate::limits::{MAX_BODY_BYTES, MAX_FORWARD_BATCH_BYTES, MAX_SMALL_RAFT_BODY_BYTES};
use crate::metrics::{record, tag_route};
use crate::raft_routes::raft_routes;
use crate::raw_path::{self, PATH_RAW_REPLAY};
use crate::state::{AppState, SharedState};

/// The admin API routes (`/v1/...`), forwarded to the leader when needed.
fn v1_routes(state: &SharedState) -> Router<SharedState> {
    admin_routes().route_layer(from_fn_with_state(state.clone(), forward_to_leader))
}

/// The admin API routes.
fn admin_routes() -> Router<SharedState> {
    Router::new()
        .route("/v1/datanodes", get(datanodes::list))
        .route(
            "/v1/datanodes/{id}",
            put(datanodes::register)
                .get(datanodes::get)
                .delete(datanodes::remove),
        )
        .route(
            "/v1/datanodes/{id}/shards",
            post(datanodes::register_shards).get(datanodes::list_shards),
        )
        .route("/v1/datanodes/{id}/prune", post(datanodes::prune))
        .route("/v1/datanodes/{id}/heartbeat", post(datanodes::heartbeat))
        .route("/v1/liveness", get(datanodes::liveness))
        .route(
            "/v1/datanodes/{id}/shards/{shard}",
            axum::routing::delete(datanodes::deregister_shard),
        )
        .route("/v1/shards", get(shards::list))
        .route("/v1/shards/{id}", get(shards::get))
        .route("/v1/kv", get(kv::list))
        .route(
            "/v1/kv/{*key}",
            put(kv::put).get(kv::get).delete(kv::delete),
        )
        .route(WATCH_PATH, get(watch::watch))
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/cluster/init", post(cluster::init))
        .route("/v1/cluster/learners", post(cluster::add_learner))
        .route(
            "/v1/cluster/learners/{id}",
            axum::routing::delete(cluster::remove_learner),
        )
        .route("/v1/cluster/voters", put(cluster::change_voters))
        .route(
            "/v1/cluster/voters/{id}",
            put(cluster::add_voter).delete(cluster::remove_voter),
        )
        .route("/v1/cluster/leader", put(cluster::set_leader))
        .route("/v1/cluster/epoch-floor", put(cluster::raise_epoch_floor))
        .route(
            "/v1/cluster/restore",
            axum::routing::delete(cluster::end_restore),
        )
        .route("/v1/cluster/members/{id}", put(cluster::change_address))
        .route(
            "/v1/cluster/snapshot",
            post(cluster::build_snapshot).get(cluster::download_snapshot),
        )
        .route(
            "/v1/config",
            get(cluster::get_config).patch(cluster::patch_config),
        )
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// The watch route: the server hands its requests a [`crate::hangup::Hangup`].
pub const WATCH_PATH: &str = "/v1/watch";

/// The complete router of a node. It answers requests only: the leader's notices to the nodes
/// a membership change removed come from [`crate::removal_notices::run`], spawned beside it.
pub fn router(state: AppState) -> Router {
    let token = state.token.clone();
    let app = routes(state);
    // A replay whose path an HTTP client would have changed comes with the path in a header;
    // it is routed through everything else, as if it had come so (`raw_path.rs`). The token
    // is checked first here too: an outsider learns nothing of the route.
    let inner = app.clone();
    app.route(
        PATH_RAW_REPLAY,
        any(move |request| raw_path::serve(inner.clone(), request))
            .layer(from_fn_with_state(token, require_token)),
    )
}

/// Every route but [`PATH_RAW_REPLAY`].
fn routes(state: AppState) -> Router {
    let state = SharedState::new(state);
    let node = state.node.clone();
    let reader = state.node.clone();
    let alarmed = state.node.clone();
    Router::new()
        .merge(v1_routes(&state))
        .merge(
            raft_routes()
                .route(
                    PATH_IDENTITY,
                    post(cluster_identity::identity).layer(from_fn_with_state(
                        MAX_SMALL_RAFT_BODY_BYTES,
                        bounded_raft_body,
                    )),
                )
                .route_layer(from_fn_with_state(state.clone(), check_cluster)),
        )
        .route(
            PATH_FORWARD_BATCH,
            post(move |headers, body| forward_batch::serve(node.clone(), headers, body))
                .layer::<_, std::convert::Infallible>(from_fn_with_state(
                    MAX_FORWARD_BATCH_BYTES,
                    bounded_raft_body,
                ))
                .layer(DefaultBodyLimit::max(MAX_FORWARD_BATCH_BYTES))
                .layer(from_fn_with_state(state.clone(), check_member)),
        )
        .route(
            PATH_ROOM,
            post(move |body| disk_alarm::serve(alarmed.clone(), body))
                .layer(from_fn_with_state(
                    MAX_SMALL_RAFT_BODY_BYTES,
                    bounded_raft_body,
                ))
                .layer(from_fn_with_state(state.clone(), check_member)),
        )
        .route(
            PATH_READ_INDEX,
            post(move |body| follower_read::serve(reader.clone(), body))
                .layer(from_fn_with_state(
                    MAX_SMALL_RAFT_BODY_BYTES,
                    bounded_raft_body,
                ))
                .layer(from_fn_with_state(state.clone(), check_member)),
        )
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(from_fn_with_state(state.token.clone(), require_token))
        .route_layer(from_fn(tag_route))
        // A path no route takes asks for the token too: an outsider learns nothing of the routes.
        .fallback(not_found.layer(from_fn_with_state(state.token.clone(), require_token)))
        .layer(from_fn_with_state(
            state.answer_budget.clone(),
            answer_budget::limit,
        ))
        .layer(from_fn_with_state(state.metrics.clone(), record))
        .with_state(state)
}
