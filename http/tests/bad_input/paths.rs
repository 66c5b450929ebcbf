//! Bad paths and methods: ids in paths that are not canonical decimals, wrong methods and
//! unknown routes.

use axum::http::Method as M;

use crate::helpers::{case, Case};

/// Ids in paths: negative, overflowing, or not written in canonical decimal.
pub fn ids() -> Vec<Case> {
    vec![
        case(
            "negative path id",
            M::PUT,
            "/v1/datanodes/-1",
            r#"{"addr":"a:1"}"#,
            400,
            "invalid_path",
        ),
        case(
            "overflowing path id",
            M::GET,
            "/v1/datanodes/18446744073709551616",
            "",
            400,
            "invalid_path",
        ),
        case(
            "non-numeric path id",
            M::DELETE,
            "/v1/datanodes/seven",
            "",
            400,
            "invalid_path",
        ),
        case(
            "negative shard in path",
            M::DELETE,
            "/v1/datanodes/7/shards/-1",
            "",
            400,
            "invalid_path",
        ),
        case(
            "overflowing shard in path",
            M::GET,
            "/v1/shards/99999999999999999999",
            "",
            400,
            "invalid_path",
        ),
        case(
            "path id with a leading zero",
            M::GET,
            "/v1/shards/007",
            "",
            400,
            "invalid_path",
        ),
        case(
            "path id with a plus sign",
            M::PUT,
            "/v1/datanodes/+7",
            r#"{"addr":"a:1"}"#,
            400,
            "invalid_path",
        ),
        case(
            "shard id in path with a leading zero",
            M::DELETE,
            "/v1/datanodes/7/shards/01",
            "",
            400,
            "invalid_path",
        ),
        // A %-escape spells an id a second way.
        case(
            "percent-encoded path id",
            M::PUT,
            "/v1/datanodes/%37",
            r#"{"addr":"a:1"}"#,
            400,
            "invalid_path",
        ),
        case(
            "percent-encoded shard id in a drop",
            M::DELETE,
            "/v1/datanodes/7/shards/%31",
            "",
            400,
            "invalid_path",
        ),
        case(
            "percent-encoded shard id in a read",
            M::GET,
            "/v1/shards/%31",
            "",
            400,
            "invalid_path",
        ),
    ]
}

/// Wrong methods on known paths, and an unknown path.
pub fn wrong_methods_and_paths() -> Vec<Case> {
    vec![
        // Wrong methods and paths.
        case(
            "POST a datanode",
            M::POST,
            "/v1/datanodes/7",
            r#"{"addr":"a:1"}"#,
            405,
            "method_not_allowed",
        ),
        case(
            "PUT the shard list",
            M::PUT,
            "/v1/shards",
            "{}",
            405,
            "method_not_allowed",
        ),
        case(
            "DELETE the cluster",
            M::DELETE,
            "/v1/cluster",
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "unknown path",
            M::PUT,
            "/v1/datanode/7",
            r#"{"addr":"a:1"}"#,
            404,
            "not_found",
        ),
    ]
}

/// Replays with a raw path (`/v1/raw-replay`) that name no admin API path, or that the path
/// they name refuses.
pub fn raw_replays() -> Vec<Case> {
    let replay = |what, method, path: &'static str, body: &str, status, code| {
        let mut c = case(what, method, "/v1/raw-replay", body, status, code);
        if !path.is_empty() {
            c.headers.push(("x-metaserver-raw-path", path));
        }
        c
    };
    vec![
        replay(
            "raw replay without its path",
            M::GET,
            "",
            "",
            400,
            "invalid_replay",
        ),
        replay(
            "raw replay of itself",
            M::GET,
            "/v1/raw-replay",
            "",
            400,
            "invalid_replay",
        ),
        replay(
            "raw replay of a Raft route",
            M::POST,
            "/raft/vote",
            "",
            400,
            "invalid_replay",
        ),
        replay(
            "raw replay that is not a path",
            M::GET,
            "v1/kv/a",
            "",
            400,
            "invalid_replay",
        ),
        replay(
            "raw replay writing a new key with a dot segment",
            M::PUT,
            "/v1/kv/a/../b",
            r#"{"value":"x"}"#,
            400,
            "invalid_key",
        ),
        // An outsider learns nothing of the route: the token is checked before its header.
        Case {
            headers: vec![],
            ..case(
                "raw replay without its path nor a token",
                M::GET,
                "/v1/raw-replay",
                "",
                401,
                "unauthorized",
            )
        },
        Case {
            headers: vec![("x-metaserver-raw-path", "/v1/kv/k")],
            ..case(
                "raw replay without a token",
                M::GET,
                "/v1/raw-replay",
                "",
                401,
                "unauthorized",
            )
        },
    ]
}
