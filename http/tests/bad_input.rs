//! The bad-input matrix: every malformed request gets its status and error code, and the
//! registry is exactly as it was afterwards.

mod common;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::{call, leader_node, TestNode};
use serde_json::json;

const TOKEN: &str = "matrix-token";
const AUTH: (&str, &str) = ("authorization", "Bearer matrix-token");

/// One bad request and what it must answer.
struct Case {
    what: &'static str,
    method: Method,
    uri: String,
    body: Vec<u8>,
    headers: Vec<(&'static str, &'static str)>,
    status: StatusCode,
    code: &'static str,
}

fn case(
    what: &'static str,
    method: Method,
    uri: impl Into<String>,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        what,
        method,
        uri: uri.into(),
        body: body.into(),
        headers: vec![AUTH],
        status: StatusCode::from_u16(status).unwrap(),
        code,
    }
}

fn shards_body(n: u64) -> String {
    let shards: Vec<_> = (0..n)
        .map(|i| json!({"id": i, "generation": 1, "size": 1}))
        .collect();
    json!({"epoch": 2, "shards": shards}).to_string()
}

/// A node with a token, datanode 7 holding one shard, and one key.
async fn populated() -> (TestNode, u64) {
    let t = leader_node(Some(TOKEN)).await;
    let a = call(
        &t.app,
        Method::PUT,
        "/v1/datanodes/7",
        r#"{"addr":"10.0.0.7:9000"}"#,
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let epoch = a.json()["epoch"].as_u64().unwrap();
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 3, "size": 10}]});
    let a = call(
        &t.app,
        Method::POST,
        "/v1/datanodes/7/shards",
        body.to_string(),
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // The report is complete (the prune drops nothing). The first prune raises the cluster's
    // version: done here, the refused prunes of the cases change nothing at all.
    let prune = json!({ "epoch": epoch }).to_string();
    let a = call(
        &t.app,
        Method::POST,
        "/v1/datanodes/7/prune",
        prune,
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(t.node.cluster_version(), meta_consensus::BUILD_VERSION);
    let a = call(&t.app, Method::PUT, "/v1/kv/existing", "v", &[AUTH]).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    (t, epoch)
}

fn matrix(epoch: u64) -> Vec<Case> {
    use Method as M;
    let shards = "/v1/datanodes/7/shards";
    let one_shard =
        |shard: serde_json::Value| json!({"epoch": epoch, "shards": [shard]}).to_string();
    let mut cases = vec![
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
            "negative learner id",
            M::POST,
            "/v1/cluster/learners",
            r#"{"id":-4,"addr":"a:1"}"#,
            400,
            "invalid_body",
        ),
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
        case(
            "key prefix that is not UTF-8",
            M::GET,
            "/v1/kv?prefix=a%ff",
            "",
            400,
            "invalid_query",
        ),
        case(
            "watch index with a leading zero",
            M::GET,
            "/v1/watch?after=007",
            "",
            400,
            "invalid_query",
        ),
        case(
            "limit with a plus sign",
            M::GET,
            "/v1/shards?limit=%2B5",
            "",
            400,
            "invalid_query",
        ),
        case(
            "key prefix with a malformed escape",
            M::GET,
            "/v1/kv?prefix=%2",
            "",
            400,
            "invalid_query",
        ),
        case(
            "watch prefix that is not UTF-8",
            M::GET,
            "/v1/watch?prefix=%c3",
            "",
            400,
            "invalid_query",
        ),
        case(
            "negative limit",
            M::GET,
            "/v1/shards?limit=-1",
            "",
            400,
            "invalid_query",
        ),
        case(
            "overflowing limit",
            M::GET,
            "/v1/shards?limit=99999999999999999999",
            "",
            400,
            "invalid_query",
        ),
        case(
            "word limit",
            M::GET,
            "/v1/datanodes/7/shards?limit=ten",
            "",
            400,
            "invalid_query",
        ),
        case(
            "watch from a negative index",
            M::GET,
            "/v1/watch?after=-1",
            "",
            400,
            "invalid_query",
        ),
        case(
            "local watch from past any log index",
            M::GET,
            "/v1/watch?after=18446744073709551615&consistency=local&wait_ms=0",
            "",
            400,
            "invalid_argument",
        ),
        case(
            "watch with both filters",
            M::GET,
            "/v1/watch?datanode=7&prefix=a",
            "",
            400,
            "invalid_query",
        ),
        case(
            "watch waiting past the longest wait",
            M::GET,
            "/v1/watch?after=1&wait_ms=55001",
            "",
            400,
            "invalid_wait",
        ),
        case(
            "watch with a zero limit",
            M::GET,
            "/v1/watch?limit=0",
            "",
            400,
            "invalid_limit",
        ),
        case(
            "watch prefix with a control character",
            M::GET,
            "/v1/watch?prefix=a%01",
            "",
            400,
            "invalid_key",
        ),
        case(
            "watch with an unknown parameter",
            M::GET,
            "/v1/watch?since=3",
            "",
            400,
            "invalid_query",
        ),
        case(
            "watch with a bad consistency",
            M::GET,
            "/v1/watch?consistency=strong",
            "",
            400,
            "invalid_consistency",
        ),
        case(
            "watch by POST",
            M::POST,
            "/v1/watch",
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "zero limit",
            M::GET,
            "/v1/shards?limit=0",
            "",
            400,
            "invalid_limit",
        ),
        case(
            "limit above 10000",
            M::GET,
            "/v1/kv?limit=10001",
            "",
            400,
            "invalid_limit",
        ),
        case(
            "negative if_revision",
            M::PUT,
            "/v1/kv/existing?if_revision=-1",
            "v",
            400,
            "invalid_query",
        ),
        case(
            "unknown query parameter",
            M::GET,
            "/v1/shards?page=2",
            "",
            400,
            "invalid_query",
        ),
        case(
            "unknown write parameter",
            M::PUT,
            "/v1/kv/existing?force=1",
            "v",
            400,
            "invalid_query",
        ),
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
        case(
            "an epoch floor past what JSON holds exactly",
            M::PUT,
            "/v1/datanodes/7",
            r#"{"addr":"10.0.0.7:9000","min_epoch":9007199254740993}"#,
            400,
            "invalid_epoch",
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
        // Cursors and consistency.
        case(
            "cursor not hex",
            M::GET,
            "/v1/shards?after=zzzz",
            "",
            400,
            "invalid_cursor",
        ),
        case(
            "cursor of the wrong length",
            M::GET,
            "/v1/shards?after=00ff",
            "",
            400,
            "invalid_cursor",
        ),
        case(
            "datanode cursor not hex",
            M::GET,
            "/v1/datanodes/7/shards?after=xyz",
            "",
            400,
            "invalid_cursor",
        ),
        case(
            "cursor with a space",
            M::GET,
            "/v1/shards?after=a%20b",
            "",
            400,
            "invalid_cursor",
        ),
        case(
            "cursor too long",
            M::GET,
            format!("/v1/shards?after={}", "0".repeat(2100)),
            "",
            400,
            "invalid_cursor",
        ),
        case(
            "kv cursor not hex",
            M::GET,
            "/v1/kv?after=nothex",
            "",
            400,
            "invalid_cursor",
        ),
        case(
            "unknown consistency",
            M::GET,
            "/v1/shards?consistency=strong",
            "",
            400,
            "invalid_consistency",
        ),
        case(
            "empty consistency",
            M::GET,
            "/v1/kv/existing?consistency=",
            "",
            400,
            "invalid_consistency",
        ),
        case(
            "consistency on a datanode read",
            M::GET,
            "/v1/datanodes/7?consistency=LOCAL",
            "",
            400,
            "invalid_consistency",
        ),
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
            "/v1/liveness?limit=1",
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
    ];
    // Tokens: missing, wrong, malformed.
    for (what, headers) in [
        ("missing token", vec![]),
        ("wrong token", vec![("authorization", "Bearer nope")]),
        ("token without Bearer", vec![("authorization", TOKEN)]),
        (
            "token prefix",
            vec![("authorization", "Bearer matrix-toke")],
        ),
    ] {
        let mut c = case(
            what,
            M::PUT,
            "/v1/datanodes/7",
            r#"{"addr":"10.0.0.8:1"}"#,
            401,
            "unauthorized",
        );
        c.headers = headers.clone();
        cases.push(c);
        let mut c = case(
            what,
            M::POST,
            "/raft/append",
            vec![1u8, 0],
            401,
            "unauthorized",
        );
        c.headers = headers;
        cases.push(c);
    }
    // The routes between members refuse bodies that do not decode.
    cases.push(case(
        "garbled read index request",
        M::POST,
        "/raft/read-index",
        vec![0xffu8; 3],
        400,
        "bad_read_index_request",
    ));
    cases.push(case(
        "garbled forwarded batch",
        M::POST,
        "/raft/forward-commands",
        vec![0xffu8; 3],
        400,
        "bad_batch",
    ));
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let (t, epoch) = populated().await;
    let before = t.digest().await;
    let cluster_before = t.node.status();
    let mut failures = Vec::new();
    for c in matrix(epoch) {
        let a = call(
            &t.app,
            c.method.clone(),
            &c.uri,
            Body::from(c.body),
            &c.headers,
        )
        .await;
        let code = if a.body.is_empty() {
            String::new()
        } else {
            a.error_code()
        };
        if a.status != c.status || code != c.code {
            failures.push(format!(
                "{}: {} {} answered {} {code:?} ({}), expected {} {:?}",
                c.what,
                c.method,
                c.uri.chars().take(80).collect::<String>(),
                a.status,
                String::from_utf8_lossy(&a.body)
                    .chars()
                    .take(200)
                    .collect::<String>(),
                c.status,
                c.code
            ));
        }
        let after = t.digest().await;
        assert_eq!(after, before, "{}: the registry changed", c.what);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Neither the membership nor the node's settings moved.
    let cluster_after = t.node.status();
    assert_eq!(cluster_after.voters, cluster_before.voters);
    assert_eq!(cluster_after.learners, cluster_before.learners);
    assert_eq!(t.node.snapshot_rate(), 0);
    // And the node still serves.
    let a = call(&t.app, Method::GET, "/v1/shards/1", "", &[AUTH]).await;
    assert_eq!(a.status, StatusCode::OK);
}

/// The leader checks forwarded commands as the requests that carry them are checked: a caller
/// of `/raft/forward-commands` cannot store what the admin API refuses.
#[tokio::test]
async fn forwarded_commands_are_checked_by_the_leader() {
    use meta_consensus::{codec, Command, ShardReport};
    use meta_http::forward_batch::{Answer, Refusal, PATH_FORWARD_BATCH};

    let (t, epoch) = populated().await;
    let before = t.digest().await;
    let shard = |id| ShardReport {
        id,
        generation: 1,
        size: 1,
    };
    let put = |key: &str, value: Vec<u8>| Command::Put {
        key: key.into(),
        value,
        if_revision: None,
    };
    let bad = vec![
        put("a/../b", b"x".to_vec()),
        put("ctl\n", b"x".to_vec()),
        put("", b"x".to_vec()),
        put("big", vec![0; 1024 * 1024 + 1]),
        Command::Delete {
            key: "ctl\u{0}".into(),
            if_revision: None,
        },
        Command::RegisterDatanode {
            id: 8,
            addr: "a b c".into(),
        },
        Command::RegisterShards {
            datanode: 7,
            epoch,
            shards: vec![shard(5), shard(5)],
        },
        Command::RegisterShards {
            datanode: 7,
            epoch,
            shards: vec![],
        },
    ];
    let n = bad.len();
    let a = call(
        &t.app,
        Method::POST,
        PATH_FORWARD_BATCH,
        Body::from(codec::encode(&bad).unwrap()),
        &[AUTH],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let answers: Vec<Answer> = codec::decode(&a.body).unwrap();
    assert_eq!(answers.len(), n);
    for (cmd, answer) in bad.iter().zip(&answers) {
        assert!(
            matches!(answer, Err(Refusal::Invalid(_))),
            "{cmd} answered {answer:?}"
        );
    }
    assert_eq!(t.digest().await, before, "the registry changed");
}
