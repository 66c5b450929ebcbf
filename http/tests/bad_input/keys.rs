//! Bad keys and key prefixes: not UTF-8, with control characters or dot segments, empty
//! or too long.

use axum::http::Method as M;

use crate::helpers::{case, Case};

/// Keys that cannot be written or read, and a prefix that is too long.
pub fn keys_and_prefixes() -> Vec<Case> {
    vec![
        // Keys.
        case(
            "non-UTF-8 key",
            M::PUT,
            "/v1/kv/%FF",
            "v",
            400,
            "invalid_key",
        ),
        case(
            "non-UTF-8 key read",
            M::GET,
            "/v1/kv/a%C3%28",
            "",
            400,
            "invalid_key",
        ),
        case(
            "non-UTF-8 key delete",
            M::DELETE,
            "/v1/kv/%80",
            "",
            400,
            "invalid_key",
        ),
        case(
            "control character in key",
            M::PUT,
            "/v1/kv/a%00b",
            "v",
            400,
            "invalid_key",
        ),
        case(
            "dot segment in a new key",
            M::PUT,
            "/v1/kv/a/./b",
            "v",
            400,
            "invalid_key",
        ),
        case(
            "dot-dot key, percent-encoded",
            M::PUT,
            "/v1/kv/%2E%2E",
            "v",
            400,
            "invalid_key",
        ),
        // A `%` that starts no escape would give a key a second spelling (`a%25zz`).
        case(
            "malformed escape in a key",
            M::PUT,
            "/v1/kv/a%zz",
            "v",
            400,
            "invalid_key",
        ),
        case(
            "key ending in a lone %",
            M::PUT,
            "/v1/kv/a%",
            "v",
            400,
            "invalid_key",
        ),
        case(
            "malformed escape in a key read",
            M::GET,
            "/v1/kv/existing%2",
            "",
            400,
            "invalid_key",
        ),
        case("empty key", M::PUT, "/v1/kv/", "v", 400, "invalid_key"),
        case("empty key read", M::GET, "/v1/kv/", "", 400, "invalid_key"),
        case(
            "key too long",
            M::PUT,
            format!("/v1/kv/{}", "k".repeat(1025)),
            "v",
            400,
            "invalid_key",
        ),
        case(
            "prefix too long",
            M::GET,
            format!("/v1/kv?prefix={}", "k".repeat(1025)),
            "",
            400,
            "invalid_key",
        ),
    ]
}
