//! Bad request bodies: malformed or mistyped JSON, unknown and missing fields, numbers out of
//! range, bad shard batches, bodies over the size limits, and bodies sent to routes that take
//! none.

use axum::http::Method as M;
use serde_json::json;

use crate::helpers::{case, Case};

/// Bodies that are not the JSON the route reads: malformed, of the wrong types, with unknown
/// or missing fields, or with negative and overflowing numbers.
pub fn json(epoch: u64) -> Vec<Case> {
    let shards = "/v1/datanodes/7/shards";
    let one_shard =
        |shard: serde_json::Value| json!({"epoch": epoch, "shards": [shard]}).to_string();
    vec![
        // Malformed JSON.
        case(
            "truncated JSON",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"addr":"#,
            400,
            "malformed_json",
        ),
        case(
            "empty body",
            M::PUT,
            "/v1/datanodes/1",
            "",
            400,
            "malformed_json",
        ),
        case(
            "unquoted keys",
            M::POST,
            shards,
            "{epoch:1}",
            400,
            "malformed_json",
        ),
        case(
            "not JSON",
            M::POST,
            "/v1/cluster/learners",
            "not json",
            400,
            "malformed_json",
        ),
        case(
            "trailing comma",
            M::PATCH,
            "/v1/config",
            r#"{"snapshot_max_bytes_per_sec":1,}"#,
            400,
            "malformed_json",
        ),
        // Malformed after a field the route does not know: still malformed, not unknown.
        case(
            "truncated after an unknown field",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"a":"#,
            400,
            "malformed_json",
        ),
        case(
            "a second document after an unknown field",
            M::POST,
            shards,
            r#"{"a":1}{"b":2}"#,
            400,
            "malformed_json",
        ),
        case(
            "a trailing comma after a field the route knows",
            M::POST,
            shards,
            format!(r#"{{"epoch":{epoch},}}"#),
            400,
            "malformed_json",
        ),
        // Well-formed, but no number type holds it.
        case(
            "a number past any float",
            M::POST,
            shards,
            r#"{"epoch":1e400,"shards":[]}"#,
            400,
            "invalid_body",
        ),
        // A field that may be left out may not be null: null would read as "left out".
        case(
            "a null rate",
            M::PATCH,
            "/v1/config",
            r#"{"snapshot_max_bytes_per_sec":null}"#,
            400,
            "invalid_body",
        ),
        case(
            "a null epoch floor",
            M::PUT,
            "/v1/datanodes/7",
            r#"{"addr":"10.0.0.7:9000","min_epoch":null}"#,
            400,
            "invalid_body",
        ),
        case(
            "trailing garbage",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"addr":"a:1"} x"#,
            400,
            "malformed_json",
        ),
        case(
            "non-UTF-8 JSON",
            M::PUT,
            "/v1/datanodes/1",
            b"{\"addr\":\"\xff\xfe:1\"}".to_vec(),
            400,
            "malformed_json",
        ),
        // Wrong types.
        case(
            "addr is a number",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"addr":5}"#,
            400,
            "invalid_body",
        ),
        case(
            "epoch is a string",
            M::POST,
            shards,
            r#"{"epoch":"1","shards":[{"id":1,"generation":1,"size":1}]}"#,
            400,
            "invalid_body",
        ),
        case(
            "shards is an object",
            M::POST,
            shards,
            format!(r#"{{"epoch":{epoch},"shards":{{"id":1}}}}"#),
            400,
            "invalid_body",
        ),
        case(
            "shard is an array",
            M::POST,
            shards,
            format!(r#"{{"epoch":{epoch},"shards":[[1,1,1]]}}"#),
            400,
            "invalid_body",
        ),
        case(
            "body is an array",
            M::POST,
            shards,
            format!(r#"[{epoch},[]]"#),
            400,
            "invalid_body",
        ),
        case(
            "body is null",
            M::PUT,
            "/v1/datanodes/1",
            "null",
            400,
            "invalid_body",
        ),
        case(
            "voters is a string",
            M::PUT,
            "/v1/cluster/voters",
            r#"{"voters":"1"}"#,
            400,
            "invalid_body",
        ),
        case(
            "leader id is a string",
            M::PUT,
            "/v1/cluster/leader",
            r#"{"id":"2"}"#,
            400,
            "invalid_body",
        ),
        case(
            "leader body names no id",
            M::PUT,
            "/v1/cluster/leader",
            r#"{"to":2}"#,
            400,
            "invalid_body",
        ),
        case(
            "rate is a word",
            M::PATCH,
            "/v1/config",
            r#"{"snapshot_max_bytes_per_sec":"fast"}"#,
            400,
            "invalid_body",
        ),
        case(
            "members is a list",
            M::POST,
            "/v1/cluster/init",
            r#"{"members":[1]}"#,
            400,
            "invalid_body",
        ),
        case(
            "size is a float",
            M::POST,
            shards,
            one_shard(json!({"id":1,"generation":1,"size":1.5})),
            400,
            "invalid_body",
        ),
        // Unknown and missing fields.
        case(
            "unknown field",
            M::PUT,
            "/v1/datanodes/1",
            r#"{"addr":"a:1","zone":"x"}"#,
            400,
            "invalid_body",
        ),
        case(
            "unknown shard field",
            M::POST,
            shards,
            one_shard(json!({"id":1,"generation":1,"size":1,"crc":0})),
            400,
            "invalid_body",
        ),
        case(
            "unknown config field",
            M::PATCH,
            "/v1/config",
            r#"{"rate":1}"#,
            400,
            "invalid_body",
        ),
        case(
            "unknown learner field",
            M::POST,
            "/v1/cluster/learners",
            r#"{"id":4,"addr":"a:1","voter":true}"#,
            400,
            "invalid_body",
        ),
        case(
            "missing field",
            M::PUT,
            "/v1/datanodes/1",
            "{}",
            400,
            "invalid_body",
        ),
        case(
            "missing shard field",
            M::POST,
            shards,
            one_shard(json!({"id":1,"generation":1})),
            400,
            "invalid_body",
        ),
        // Negative and overflowing numbers.
        case(
            "negative epoch",
            M::POST,
            shards,
            r#"{"epoch":-1,"shards":[{"id":1,"generation":1,"size":1}]}"#,
            400,
            "invalid_body",
        ),
        case(
            "negative shard id",
            M::POST,
            shards,
            one_shard(json!({"id":-5,"generation":1,"size":1})),
            400,
            "invalid_body",
        ),
        case(
            "overflowing generation",
            M::POST,
            shards,
            format!(
                r#"{{"epoch":{epoch},"shards":[{{"id":1,"generation":18446744073709551616,"size":1}}]}}"#
            ),
            400,
            "invalid_body",
        ),
        case(
            "negative rate",
            M::PATCH,
            "/v1/config",
            r#"{"snapshot_max_bytes_per_sec":-5}"#,
            400,
            "invalid_body",
        ),
        case(
            "negative member id",
            M::POST,
            "/v1/cluster/init",
            r#"{"members":{"-1":"a:1"}}"#,
            400,
            "invalid_body",
        ),
        case(
            "member id with a leading zero",
            M::POST,
            "/v1/cluster/init",
            r#"{"members":{"01":"a:1"}}"#,
            400,
            "invalid_body",
        ),
        case(
            "negative learner id",
            M::POST,
            "/v1/cluster/learners",
            r#"{"id":-4,"addr":"a:1"}"#,
            400,
            "invalid_body",
        ),
    ]
}

/// Bodies sent to routes that take none: refused, not ignored. A fenced epoch sent in the body
/// of a replica's drop (instead of its query) would otherwise drop it unfenced.
pub fn unexpected(epoch: u64) -> Vec<Case> {
    let fenced = json!({ "epoch": epoch - 1 }).to_string();
    // A body under a Content-Encoding: none is decoded, so none is taken as it came.
    let encoded = |what, method, uri: &str, body: &[u8], encoding| {
        let mut c = case(what, method, uri, body, 415, "unsupported_encoding");
        c.headers.push(("content-encoding", encoding));
        c
    };
    let gzipped_hello: &[u8] = &[
        0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9,
        0x07, 0x00, 0x86, 0xa6, 0x10, 0x36, 0x05, 0x00, 0x00, 0x00,
    ];
    let mut cases = vec![
        encoded(
            "a gzipped value",
            M::PUT,
            "/v1/kv/existing",
            gzipped_hello,
            "gzip",
        ),
        encoded(
            "a plain body declared brotli",
            M::PUT,
            "/v1/datanodes/7",
            br#"{"addr":"10.0.0.8:9000"}"#,
            "br",
        ),
        encoded(
            "identity, then gzip",
            M::PUT,
            "/v1/kv/fresh",
            b"v",
            "identity, gzip",
        ),
    ];
    cases.extend([
        case(
            "an epoch in the body of a replica's drop",
            M::DELETE,
            "/v1/datanodes/7/shards/1",
            fenced.clone(),
            400,
            "unexpected_body",
        ),
        case(
            "a body on a datanode's removal",
            M::DELETE,
            "/v1/datanodes/7",
            fenced,
            400,
            "unexpected_body",
        ),
        case(
            "a body on a key's delete",
            M::DELETE,
            "/v1/kv/existing",
            r#"{"if_revision":1}"#,
            400,
            "unexpected_body",
        ),
        case(
            "a body on a learner's removal",
            M::DELETE,
            "/v1/cluster/learners/4",
            "{}",
            400,
            "unexpected_body",
        ),
        case(
            "a body on a snapshot build",
            M::POST,
            "/v1/cluster/snapshot",
            "garbage",
            400,
            "unexpected_body",
        ),
        case(
            "a body on a read",
            M::GET,
            "/v1/shards/1",
            r#"{"consistency":"local"}"#,
            400,
            "unexpected_body",
        ),
        case(
            "a body on a listing",
            M::GET,
            "/v1/datanodes/7/shards",
            "{}",
            400,
            "unexpected_body",
        ),
        case(
            "a body on a watch",
            M::GET,
            "/v1/watch?after=1",
            "{}",
            400,
            "unexpected_body",
        ),
    ]);
    cases
}

/// Shard batches that are empty, repeat a shard or are too large, and bodies over the limits.
pub fn batches_and_sizes(epoch: u64) -> Vec<Case> {
    let shards = "/v1/datanodes/7/shards";
    vec![
        // Batches.
        case(
            "empty batch",
            M::POST,
            shards,
            format!(r#"{{"epoch":{epoch},"shards":[]}}"#),
            400,
            "empty_batch",
        ),
        case(
            "duplicate shard in batch",
            M::POST,
            shards,
            format!(
                r#"{{"epoch":{epoch},"shards":[{{"id":1,"generation":4,"size":1}},{{"id":1,"generation":5,"size":1}}]}}"#
            ),
            400,
            "duplicate_shard",
        ),
        case(
            "batch of 10001",
            M::POST,
            shards,
            shards_body(10_001),
            413,
            "batch_too_large",
        ),
        // Bodies over the limits.
        case(
            "body over 2 MiB",
            M::PUT,
            "/v1/kv/big",
            vec![b'x'; 2 * 1024 * 1024 + 1],
            413,
            "body_too_large",
        ),
        case(
            "JSON body over 2 MiB",
            M::POST,
            shards,
            vec![b' '; 3 * 1024 * 1024],
            413,
            "body_too_large",
        ),
        case(
            "value over 1 MiB",
            M::PUT,
            "/v1/kv/big",
            vec![b'x'; 1024 * 1024 + 1],
            413,
            "value_too_large",
        ),
    ]
}

fn shards_body(n: u64) -> String {
    let shards: Vec<_> = (0..n)
        .map(|i| json!({"id": i, "generation": 1, "size": 1}))
        .collect();
    json!({"epoch": 2, "shards": shards}).to_string()
}
