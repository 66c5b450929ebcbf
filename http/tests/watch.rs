//! `GET /v1/watch` against a real single-node `MetaNode`: the starting index, the events of
//! every kind with their JSON shape, filters, paging, a long poll woken by a write, the
//! compacted answer, the history a page names, and a stopping node answering its waiting
//! watches.

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::{leader_node, leader_node_tuned};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The index a watch without `after` answers.
async fn start(t: &common::TestNode) -> u64 {
    let a = t.get("/v1/watch").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let v = a.json();
    assert_eq!(v["events"], json!([]));
    v["index"].as_u64().unwrap()
}

/// The events of a watch answer, without their indexes.
fn changes(v: &Value) -> Vec<Value> {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.as_object_mut().unwrap().remove("index");
            e
        })
        .collect()
}

/// Sends `GET uri` on its own task: a watch that may wait.
fn watch_in_background(
    t: &common::TestNode,
    uri: String,
) -> tokio::task::JoinHandle<common::Answer> {
    let app = t.app.clone();
    tokio::spawn(async move { common::call(&app, Method::GET, &uri, "", &[]).await })
}

#[tokio::test]
async fn reports_every_kind_of_change_with_filters_and_pages() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let epoch = t.register_datanode(7).await;
    let body = json!({"epoch": epoch, "shards": [
        {"id": 1, "generation": 1, "size": 10}, {"id": 2, "generation": 1, "size": 10}]});
    let a = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // The same again changes nothing, and reports nothing.
    let a = t
        .send(Method::POST, "/v1/datanodes/7/shards", body.to_string())
        .await;
    assert_eq!(a.json()["unchanged"], 2);
    let a = t.send(Method::DELETE, "/v1/datanodes/7/shards/2", "").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t.send(Method::PUT, "/v1/kv/cfg/a", "1").await;
    let revision = a.json()["revision"].as_u64().unwrap();
    t.send(Method::DELETE, "/v1/kv/cfg/a", "").await;
    t.send(Method::DELETE, "/v1/datanodes/7", "").await;

    let a = t.get(&format!("/v1/watch?after={from}&wait_ms=0")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let all = a.json();
    assert_eq!(
        changes(&all),
        vec![
            json!({"kind":"datanode_registered","datanode":7,"addr":"10.0.0.7:9000","epoch":epoch}),
            json!({"kind":"replicas_registered","datanode":7,"shards":[1,2]}),
            json!({"kind":"replicas_removed","datanode":7,"shards":[2]}),
            json!({"kind":"kv_put","key":"cfg/a"}),
            json!({"kind":"kv_deleted","key":"cfg/a"}),
            json!({"kind":"datanode_removed","datanode":7,"replicas_removed":1}),
        ]
    );
    assert_eq!(all["events"][0]["index"], epoch);
    assert_eq!(all["events"][3]["index"], revision);
    let last = all["index"].as_u64().unwrap();
    assert!(last >= all["events"][5]["index"].as_u64().unwrap());

    let a = t
        .get(&format!("/v1/watch?after={from}&wait_ms=0&prefix=cfg/"))
        .await;
    assert_eq!(changes(&a.json()).len(), 2, "{a:?}");
    assert_eq!(a.json()["index"], last);
    let a = t
        .get(&format!(
            "/v1/watch?after={from}&wait_ms=0&datanode=7&consistency=local"
        ))
        .await;
    assert_eq!(changes(&a.json()).len(), 4, "{a:?}");

    // Pages of two, each going on from the last.
    let mut seen = Vec::new();
    let mut at = from;
    loop {
        let a = t
            .get(&format!("/v1/watch?after={at}&wait_ms=0&limit=2"))
            .await;
        let v = a.json();
        if v["events"].as_array().unwrap().is_empty() {
            assert_eq!(v["index"].as_u64().unwrap(), last);
            break;
        }
        seen.extend(changes(&v));
        let index = v["index"].as_u64().unwrap();
        assert!(
            index > at,
            "a page of events ends at {index}, not past {at}"
        );
        at = index;
    }
    assert_eq!(seen, changes(&all));
}

#[tokio::test]
async fn a_waiting_watch_answers_the_write_that_wakes_it() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let waiting = watch_in_background(&t, format!("/v1/watch?after={from}&prefix=k"));
    // Written before or after the watch began to wait, it is in the answer.
    let a = t.send(Method::PUT, "/v1/kv/k1", "v").await;
    let revision = a.json()["revision"].as_u64().unwrap();
    let a = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the watch did not wake on the write")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(
        a.json()["events"],
        json!([{"index": revision, "kind":"kv_put","key":"k1"}])
    );
}

#[tokio::test]
async fn a_watch_with_nothing_new_answers_at_its_wait_with_the_index_reached() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    // A change the filter leaves out moves the index on.
    t.send(Method::PUT, "/v1/kv/other", "v").await;
    let a = t
        .get(&format!("/v1/watch?after={from}&prefix=cfg/&wait_ms=50"))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["events"], json!([]));
    assert!(a.json()["index"].as_u64().unwrap() > from);
}

#[tokio::test]
async fn an_index_from_before_the_history_kept_is_gone() {
    // A history of two units: a registration of one shard (two units) pushes out the rest.
    let t = leader_node_tuned(None, |cfg| cfg.watch_history = 2).await;
    let from = start(&t).await;
    let epoch = t.register_datanode(1).await;
    let body = json!({"epoch": epoch, "shards": [{"id": 1, "generation": 1, "size": 1}]});
    let a = t
        .send(Method::POST, "/v1/datanodes/1/shards", body.to_string())
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = t.get(&format!("/v1/watch?after={from}")).await;
    assert_eq!(a.status, StatusCode::GONE, "{a:?}");
    assert_eq!(a.error_code(), "compacted");
    let message = a.error_message();
    assert!(message.contains("watch from the index"), "{message}");
    // From the floor on, the rest is there.
    let a = t
        .get(&format!(
            "/v1/watch?after={}&wait_ms=0",
            t.node.watch_floor()
        ))
        .await;
    assert_eq!(
        changes(&a.json()),
        vec![json!({"kind":"replicas_registered","datanode":1,"shards":[1]})]
    );
}

#[tokio::test]
async fn a_stopping_node_answers_its_waiting_watches_at_once() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let waiting = watch_in_background(&t, format!("/v1/watch?after={from}&wait_ms=55000"));
    // Whether the watch waits yet or not, closing answers it.
    t.node.begin_close();
    let a = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("a closing node kept a watch waiting")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["events"], json!([]));
}

#[tokio::test]
async fn a_watch_from_past_the_newest_index_is_refused() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    // Such an index comes from another cluster (a restored one counts from 1 again): waiting
    // for the log to reach it would skip every change until then.
    for after in [from + 1000, u64::MAX] {
        let a = t
            .get(&format!("/v1/watch?after={after}&wait_ms=55000"))
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
        let message = a.error_message();
        // u64::MAX is past any log index: refused before the leader is asked.
        assert!(
            message.contains("past the cluster's newest index")
                || message.contains("past any log index"),
            "{message}"
        );
    }
    // The newest index itself is where a watcher that is up to date waits.
    let a = t.get(&format!("/v1/watch?after={from}&wait_ms=0")).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
}

#[tokio::test]
async fn watches_past_the_waiting_slots_are_refused_and_the_rest_pass() {
    let t = leader_node(None).await;
    let state = meta_http::AppState::new(t.node.clone(), meta_http::Token::new(None));
    let app = meta_http::router(state.with_watch_slots(1));
    let from = start(&t).await;
    let uri = format!("/v1/watch?after={from}&wait_ms=55000");
    let waiting = {
        let (app, uri) = (app.clone(), uri.clone());
        tokio::spawn(async move { common::call(&app, Method::GET, &uri, "", &[]).await })
    };
    tokio::time::timeout(Duration::from_secs(20), async {
        while t.node.status().watches_waiting < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first watch waits");
    let a = common::call(&app, Method::GET, &uri, "", &[]).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(a.error_code(), "overloaded");
    // A watch that does not wait needs no slot.
    let quick = format!("/v1/watch?after={from}&wait_ms=0");
    let a = common::call(&app, Method::GET, &quick, "", &[]).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // The write answers the waiting watch, which gives its slot back.
    t.send(Method::PUT, "/v1/kv/k", "v").await;
    let a = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the watch did not wake on the write")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let index = a.json()["index"].as_u64().unwrap();
    let a = common::call(
        &app,
        Method::GET,
        &format!("/v1/watch?after={from}&wait_ms=55000"),
        "",
        &[],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["index"].as_u64(), Some(index));
}

/// A page names the history its index counts in; a watch that gives it back goes on, one that
/// names another history (an index of another cluster, or of one restored from a backup) is
/// told its index means nothing here, and a name that is none is refused.
#[tokio::test]
async fn a_watch_from_another_history_is_told_its_index_means_nothing_here() {
    let t = leader_node(None).await;
    let a = t.get("/v1/watch").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let page = a.json();
    let history = page["history"].as_str().expect("a page names its history");
    assert_eq!(Some(history.to_string()), t.node.history_name());
    let from = page["index"].as_u64().unwrap();

    let same = t
        .get(&format!(
            "/v1/watch?after={from}&history={history}&wait_ms=0"
        ))
        .await;
    assert_eq!(same.status, StatusCode::OK, "{same:?}");
    assert_eq!(same.json()["history"], history);

    let other = meta_consensus::history_name(t.node.cluster_id().unwrap() ^ 1);
    let gone = t
        .get(&format!("/v1/watch?after={from}&history={other}&wait_ms=0"))
        .await;
    assert_eq!(gone.status, StatusCode::GONE, "{gone:?}");
    assert_eq!(gone.json()["error"]["code"], "compacted");
    assert!(
        gone.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not this cluster's history"),
        "{gone:?}"
    );

    for bad in [
        "xyz",
        "303E6F2145F7FB2F",
        "303e6f2145f7fb2",
        "303e6f2145f7fb2f0",
    ] {
        let a = t
            .get(&format!("/v1/watch?after={from}&history={bad}&wait_ms=0"))
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}: {a:?}");
        assert_eq!(a.json()["error"]["code"], "invalid_argument", "{bad}");
    }
}

/// A node that knows no cluster yet (a member added a moment ago learns its id from the
/// leader's first message) does not call a watcher's history another one: it answers 503, and
/// the watcher keeps its state and retries.
#[tokio::test]
async fn a_node_of_no_cluster_yet_asks_a_watcher_to_retry() {
    let t = common::open_node(None).await;
    assert_eq!(t.node.history_name(), None);
    let a = t
        .get("/v1/watch?after=5&history=303e6f2145f7fb2f&wait_ms=0")
        .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert!(a.headers.contains_key("retry-after"), "{a:?}");
}

/// Serves `t`'s node on a real listener, as a member does, with one watch slot.
async fn serve_with_one_watch_slot(
    t: &common::TestNode,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let state = meta_http::AppState::new(t.node.clone(), meta_http::Token::new(None));
    let app = meta_http::router(state.with_watch_slots(1));
    let tcp = meta_http::connection_limit::bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        meta_http::Server::new(meta_http::LimitedListener::new(tcp, 16), app).serve(async {
            let _ = stopped.await;
        }),
    );
    (addr, stop, task)
}

/// Sends a long poll from `from` on a new connection, and waits until it waits.
async fn long_poll(t: &common::TestNode, addr: std::net::SocketAddr, from: u64) -> TcpStream {
    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /v1/watch?after={from}&wait_ms=55000 HTTP/1.1\r\nHost: t\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        while t.node.status().watches_waiting < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the long poll waits");
    client
}

/// A long poll whose client went away gives its slots back at once, not at the end of its
/// wait (55 s here): the next watch gets the one watch slot.
#[tokio::test]
async fn a_long_poll_whose_client_went_away_gives_its_slot_back() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let (addr, stop, task) = serve_with_one_watch_slot(&t).await;
    let gone = long_poll(&t, addr, from).await;
    assert_eq!(slots_taken(addr).await, 1);
    drop(gone);
    tokio::time::timeout(Duration::from_secs(20), async {
        while t.node.status().watches_waiting > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the abandoned long poll still waits");
    assert_eq!(slots_taken(addr).await, 0);
    // The slot is free: the next long poll waits, and a write answers it.
    let mut next = long_poll(&t, addr, from).await;
    t.send(Method::PUT, "/v1/kv/k", "v").await;
    let answer = tokio::time::timeout(Duration::from_secs(20), read_answer(&mut next))
        .await
        .expect("the second long poll is answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""key":"k""#), "{answer}");
    stop.send(()).unwrap();
    drop(next);
    task.await.unwrap();
}

/// A client that closes only its sending side after a long poll is answered at once, with a
/// page that claims no change (its index is the one asked from), and reads it.
#[tokio::test]
async fn a_long_poll_half_closed_by_its_client_is_answered_at_once() {
    let t = leader_node(None).await;
    let from = start(&t).await;
    let (addr, stop, task) = serve_with_one_watch_slot(&t).await;
    let mut client = long_poll(&t, addr, from).await;
    client.shutdown().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), read_answer(&mut client))
        .await
        .expect("the half-closed long poll is answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body: Value =
        serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(body["index"].as_u64(), Some(from), "{answer}");
    assert_eq!(body["events"], json!([]), "{answer}");
    // An index past what the member applied is not handed back unchecked (it may be no index
    // of this cluster's).
    let mut client = TcpStream::connect(addr).await.unwrap();
    let past = from + 1000;
    let request = format!("GET /v1/watch?after={past}&wait_ms=55000 HTTP/1.1\r\nHost: t\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    client.shutdown().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), read_answer(&mut client))
        .await
        .expect("the half-closed long poll is answered");
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.contains(&format!("\"index\":{past}")), "{answer}");
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// `metaserver_watch_slots_taken` of the server at `addr`.
async fn slots_taken(addr: std::net::SocketAddr) -> u64 {
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answer(&mut client).await;
    let line = answer
        .lines()
        .find(|l| l.starts_with("metaserver_watch_slots_taken "))
        .unwrap_or_else(|| panic!("no slot gauge: {answer}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Reads one answer (headers and a body of `content-length` bytes) from `client`.
async fn read_answer(client: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the whole answer: {bytes:?}");
        bytes.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&bytes).to_string();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length = text[..end]
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            })
            .expect("a content-length");
        if bytes.len() >= end + 4 + length {
            return text;
        }
    }
}
