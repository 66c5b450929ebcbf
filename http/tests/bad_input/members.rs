//! Bad addresses and members: addresses that are not `host:port`, node id 0, empty or
//! repeated member lists, and query parameters the datanode and cluster routes do not take.

use axum::http::Method as M;

use crate::helpers::{case, Case};

/// Addresses, epoch floors and member lists the registry and the cluster refuse.
pub fn addresses_and_members() -> Vec<Case> {
    vec![
        // Addresses and members.
        case(
            "address without port",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"addr":"10.0.0.1"}"#,
            400,
            "invalid_addr",
        ),
        case(
            "address with port 0",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"addr":"10.0.0.1:0"}"#,
            400,
            "invalid_addr",
        ),
        case(
            "empty address",
            M::POST,
            "/v1/cluster/learners",
            r#"{"id":4,"addr":""}"#,
            400,
            "invalid_addr",
        ),
        case(
            "learner address with two hosts",
            M::POST,
            "/v1/cluster/learners",
            r#"{"id":4,"addr":"127.0.0.1:7121;2=127.0.0.1:7122"}"#,
            400,
            "invalid_addr",
        ),
        // A move of a node the membership does not name is refused before anything is asked
        // of the address the request gives (which would answer 409: nothing answers there).
        case(
            "moving a node that is no member",
            M::PUT,
            "/v1/cluster/members/99",
            r#"{"addr":"127.0.0.1:1"}"#,
            404,
            "not_found",
        ),
        case(
            "moving node 0",
            M::PUT,
            "/v1/cluster/members/0",
            r#"{"addr":"127.0.0.1:1"}"#,
            404,
            "not_found",
        ),
        case(
            "an epoch floor past 2^52, which leaves no room below 2^53",
            M::PUT,
            "/v1/datanodes/7",
            r#"{"addr":"10.0.0.7:9000","min_epoch":4503599627370497}"#,
            400,
            "invalid_epoch",
        ),
        case(
            "cluster epoch floor above 2^52",
            M::PUT,
            "/v1/cluster/epoch-floor",
            r#"{"at_least":4503599627370497}"#,
            400,
            "invalid_epoch",
        ),
        case(
            "cluster epoch floor missing",
            M::PUT,
            "/v1/cluster/epoch-floor",
            r#"{}"#,
            400,
            "invalid_body",
        ),
        case(
            "cluster epoch floor negative",
            M::PUT,
            "/v1/cluster/epoch-floor",
            r#"{"at_least":-1}"#,
            400,
            "invalid_body",
        ),
        case(
            "cluster epoch floor with an unknown field",
            M::PUT,
            "/v1/cluster/epoch-floor",
            r#"{"at_least":5,"min_epoch":5}"#,
            400,
            "invalid_body",
        ),
        case(
            "datanode address of unbracketed IPv6",
            M::PUT,
            "/v1/datanodes/7",
            r#"{"addr":"::1:80"}"#,
            400,
            "invalid_addr",
        ),
        case(
            "a query parameter on a registration",
            M::PUT,
            "/v1/datanodes/7?foo=1",
            r#"{"addr":"10.0.0.7:9000"}"#,
            400,
            "invalid_query",
        ),
        case(
            "a condition a delete does not know",
            M::DELETE,
            "/v1/datanodes/7?if_epoch=5",
            "",
            400,
            "invalid_query",
        ),
        case(
            "a query parameter on the cluster view",
            M::GET,
            "/v1/cluster?verbose=1",
            "",
            400,
            "invalid_query",
        ),
        case(
            "learner id 0",
            M::POST,
            "/v1/cluster/learners",
            r#"{"id":0,"addr":"127.0.0.1:1"}"#,
            400,
            "invalid_members",
        ),
        case(
            "voter id 0",
            M::PUT,
            "/v1/cluster/voters",
            r#"{"voters":[0,1]}"#,
            400,
            "invalid_members",
        ),
        case(
            "empty members",
            M::POST,
            "/v1/cluster/init",
            r#"{"members":{}}"#,
            400,
            "invalid_members",
        ),
        case(
            "init without the node it is sent to",
            M::POST,
            "/v1/cluster/init",
            r#"{"members":{"9":"127.0.0.1:1"}}"#,
            400,
            "invalid_members",
        ),
        case(
            "empty voters",
            M::PUT,
            "/v1/cluster/voters",
            r#"{"voters":[]}"#,
            400,
            "invalid_members",
        ),
        case(
            "duplicate voters",
            M::PUT,
            "/v1/cluster/voters",
            r#"{"voters":[1,1]}"#,
            400,
            "invalid_members",
        ),
    ]
}
