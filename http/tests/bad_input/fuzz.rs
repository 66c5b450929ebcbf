//! Seeded mutations of valid requests: a field replaced by a value of another type or range,
//! removed, or joined by an unknown one; a query parameter given a random value; a body cut
//! short or replaced by garbage. Whatever comes, the answer is never a 5xx, a refusal is a JSON
//! error with a code, and a refused request changes nothing. A failure names its seed.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::common::call;
use crate::helpers::{populated, AUTH};

/// Random JSON values of every type and awkward range.
fn odd_value(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..16) {
        0 => json!(-1),
        1 => json!(0),
        2 => json!(u64::MAX),
        3 => json!(1u64 << 53),
        4 => json!(1.5),
        5 => json!(1e300),
        6 => json!(""),
        7 => json!("x".repeat(rng.usize(1..5000))),
        8 => Value::Null,
        9 => json!(true),
        10 => json!([]),
        11 => json!({}),
        12 => json!([[[[[[[[[[1]]]]]]]]]]),
        13 => json!("10.0.0.1:9000"),
        14 => json!(i64::MIN),
        _ => json!(rng.u64(..)),
    }
}

/// A random change to one field of `body` (an object, or an array of objects, nested).
fn mutate(rng: &mut fastrand::Rng, body: &mut Value) {
    match body {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            match rng.u8(0..6) {
                0 if !keys.is_empty() => {
                    map.remove(&keys[rng.usize(..keys.len())]);
                }
                1 => {
                    map.insert("unknown_field".into(), odd_value(rng));
                }
                _ if !keys.is_empty() => {
                    let key = &keys[rng.usize(..keys.len())];
                    let v = map.get_mut(key).expect("a key of the map");
                    if v.is_object() || v.is_array() && rng.bool() {
                        mutate(rng, v);
                    } else {
                        *v = odd_value(rng);
                    }
                }
                _ => {}
            }
        }
        Value::Array(items) => match rng.u8(0..4) {
            0 => items.clear(),
            1 => items.push(odd_value(rng)),
            _ if !items.is_empty() => {
                let i = rng.usize(..items.len());
                mutate(rng, &mut items[i]);
            }
            _ => {}
        },
        other => *other = odd_value(rng),
    }
}

/// Random values for a query parameter.
fn odd_param(rng: &mut fastrand::Rng) -> String {
    match rng.u8(0..10) {
        0 => "-1".into(),
        1 => "0".into(),
        2 => "18446744073709551616".into(),
        3 => "1.5".into(),
        4 => String::new(),
        5 => "%FF%FE".into(),
        6 => "zz".into(),
        7 => "linearizable".into(),
        8 => "x".repeat(rng.usize(1..3000)),
        _ => rng.u64(..).to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_are_refused_cleanly_or_served() {
    let (t, epoch) = populated().await;
    // Valid requests to start from: method, path, body.
    let bodies: Vec<(Method, &str, Value)> = vec![
        (
            Method::PUT,
            "/v1/datanodes/9",
            json!({"addr": "10.0.0.9:9000", "min_epoch": 5}),
        ),
        (
            Method::POST,
            "/v1/datanodes/7/shards",
            json!({"epoch": epoch, "shards": [{"id": 1, "generation": 3, "size": 10}]}),
        ),
        (
            Method::POST,
            "/v1/datanodes/7/prune",
            json!({"epoch": epoch}),
        ),
        (
            Method::POST,
            "/v1/datanodes/7/heartbeat",
            json!({"epoch": epoch}),
        ),
        (
            Method::PUT,
            "/v1/cluster/epoch-floor",
            json!({"at_least": 3}),
        ),
        (
            Method::PATCH,
            "/v1/config",
            json!({"snapshot_max_bytes_per_sec": 0}),
        ),
    ];
    let queries: Vec<(Method, &str, &[&str])> = vec![
        (
            Method::GET,
            "/v1/shards",
            &["limit", "after", "consistency"],
        ),
        (
            Method::GET,
            "/v1/datanodes/7/shards",
            &["limit", "after", "consistency"],
        ),
        (
            Method::GET,
            "/v1/kv",
            &["prefix", "after", "limit", "consistency"],
        ),
        (Method::GET, "/v1/kv/existing", &["consistency"]),
        (Method::PUT, "/v1/kv/fuzzed", &["if_revision"]),
        (Method::DELETE, "/v1/kv/fuzzed", &["if_revision"]),
        (Method::GET, "/v1/liveness", &["state"]),
        (Method::GET, "/v1/watch", &["after", "datanode", "prefix"]),
    ];
    let mut before = t.digest().await;
    for seed in 0..2000u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (method, uri, body) = if rng.bool() {
            let (method, path, valid) = &bodies[rng.usize(..bodies.len())];
            let mut body = valid.clone();
            for _ in 0..rng.usize(1..4) {
                mutate(&mut rng, &mut body);
            }
            let mut text = body.to_string().into_bytes();
            match rng.u8(0..8) {
                0 => text.truncate(rng.usize(..text.len())),
                1 => text = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect(),
                _ => {}
            }
            (method.clone(), path.to_string(), text)
        } else {
            let (method, path, params) = &queries[rng.usize(..queries.len())];
            let mut query = Vec::new();
            for p in params.iter() {
                if rng.bool() {
                    query.push(format!("{p}={}", odd_param(&mut rng)));
                }
            }
            // A watch with no wait: this test does not wait for changes.
            if *path == "/v1/watch" {
                query.push("wait_ms=0".into());
            }
            (
                method.clone(),
                format!("{path}?{}", query.join("&")),
                b"v".to_vec(),
            )
        };
        let a = call(&t.app, method.clone(), &uri, body.clone(), &[AUTH]).await;
        let shown = format!(
            "seed {seed}: {method} {} with {:?} answered {} {}",
            uri.chars().take(120).collect::<String>(),
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>(),
            a.status,
            String::from_utf8_lossy(&a.body)
                .chars()
                .take(300)
                .collect::<String>()
        );
        assert!(a.status.as_u16() < 500, "{shown}");
        let after = t.digest().await;
        if a.status.is_client_error() {
            assert!(!a.error_code().is_empty(), "no error code: {shown}");
            assert_eq!(
                after, before,
                "a refused request changed the registry: {shown}"
            );
        } else {
            assert!(a.status.is_success(), "{shown}");
        }
        before = after;
    }
    // The node still serves.
    let a = call(&t.app, Method::GET, "/v1/shards/1", "", &[AUTH]).await;
    assert_eq!(a.status, StatusCode::OK);
}
