//! Bad requests of a datanode's lifecycle: prunes that end a full report, heartbeats and
//! liveness queries.

use axum::http::Method as M;
use serde_json::json;

use crate::helpers::{case, Case};

/// Prunes and heartbeats without a valid current epoch or of an unknown datanode, and
/// liveness queries the route does not take.
pub fn lifecycle(epoch: u64) -> Vec<Case> {
    vec![
        // Ending a full report.
        case(
            "prune without an epoch",
            M::POST,
            "/v1/datanodes/7/prune",
            "{}",
            400,
            "invalid_body",
        ),
        case(
            "prune epoch as a string",
            M::POST,
            "/v1/datanodes/7/prune",
            json!({"epoch": epoch.to_string()}).to_string(),
            400,
            "invalid_body",
        ),
        case(
            "prune with an unknown field",
            M::POST,
            "/v1/datanodes/7/prune",
            json!({"epoch": epoch, "all": true}).to_string(),
            400,
            "invalid_body",
        ),
        case(
            "prune under a former epoch",
            M::POST,
            "/v1/datanodes/7/prune",
            json!({"epoch": epoch - 1}).to_string(),
            409,
            "fenced",
        ),
        case(
            "prune of an unknown datanode",
            M::POST,
            "/v1/datanodes/8/prune",
            json!({"epoch": epoch}).to_string(),
            404,
            "not_found",
        ),
        case(
            "heartbeat without an epoch",
            M::POST,
            "/v1/datanodes/7/heartbeat",
            "{}",
            400,
            "invalid_body",
        ),
        case(
            "heartbeat with a negative epoch",
            M::POST,
            "/v1/datanodes/7/heartbeat",
            r#"{"epoch":-1}"#,
            400,
            "invalid_body",
        ),
        case(
            "heartbeat of a former incarnation",
            M::POST,
            "/v1/datanodes/7/heartbeat",
            json!({"epoch": epoch - 1}).to_string(),
            409,
            "fenced",
        ),
        case(
            "heartbeat of an unknown datanode",
            M::POST,
            "/v1/datanodes/8/heartbeat",
            json!({"epoch": epoch}).to_string(),
            404,
            "not_found",
        ),
        case(
            "liveness in a state that does not exist",
            M::GET,
            "/v1/liveness?state=dead",
            "",
            400,
            "invalid_state",
        ),
        case(
            "liveness with an unknown query",
            M::GET,
            "/v1/liveness?consistency=lease",
            "",
            400,
            "invalid_query",
        ),
        case(
            "GET a prune",
            M::GET,
            "/v1/datanodes/7/prune",
            "",
            405,
            "method_not_allowed",
        ),
    ]
}
