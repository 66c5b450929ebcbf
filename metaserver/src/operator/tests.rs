//! The operator commands' tests: their parsing, and their requests against servers on
//! loopback that answer as members would.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::*;

#[test]
fn a_shard_listed_twice_is_found_across_batches() {
    let shard = |id| ShardBody {
        id,
        generation: 1,
        size: 1,
    };
    let mut shards: Vec<ShardBody> = (1..=MAX_SHARDS_PER_BATCH as u64).map(shard).collect();
    assert_eq!(listed_twice(&shards), None);
    shards.push(shard(1));
    assert_eq!(
        listed_twice(&shards),
        Some((1, MAX_SHARDS_PER_BATCH + 1)),
        "a duplicate in a later batch than the first"
    );
}

#[test]
fn a_shards_file_that_does_not_parse_says_what_is_wrong() {
    let list = ShardsFile::parse(r#" [{"id":1,"generation":2,"size":3}]"#).unwrap();
    assert!(matches!(list, ShardsFile::List(s) if s.len() == 1));
    let batch = ShardsFile::parse(r#"{"epoch":4,"shards":[]}"#).unwrap();
    assert!(matches!(
        batch,
        ShardsFile::Batch(BatchFile { epoch: 4, .. })
    ));
    let error = |text: &str| format!("{:#}", ShardsFile::parse(text).unwrap_err());
    let missing = error(r#"[{"id":1,"generation":2}]"#);
    assert!(missing.contains("missing field `size`"), "{missing}");
    let unknown = error(r#"{"epoch":4,"shards":[],"datanode":7}"#);
    assert!(unknown.contains("unknown field `datanode`"), "{unknown}");
    assert!(error("7").contains("no JSON list or object"));
}

/// A server on loopback that answers the n-th request (from 0) with `status(n)`, counting.
async fn server(status: fn(usize) -> StatusCode) -> (String, Arc<AtomicUsize>) {
    answering(move |n| (status(n), "{}")).await
}

/// A server on loopback that answers the n-th request (from 0) with `answer(n)`, counting;
/// a 503 with `Retry-After`, as a member's (but those where waiting does not help) is.
pub(super) async fn answering(
    answer: impl Fn(usize) -> (StatusCode, &'static str) + Clone + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    answering_with(move |n| {
        let (status, body) = answer(n);
        let mut response = (status, body).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            let retry = axum::http::HeaderValue::from_static("1");
            response.headers_mut().insert("retry-after", retry);
        }
        response
    })
    .await
}

/// A server on loopback that answers the n-th request (from 0) with `answer(n)`, counting.
pub(super) async fn answering_with(
    answer: impl Fn(usize) -> axum::response::Response + Clone + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let app = axum::Router::new().fallback(move || {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        let answer = answer(n);
        async move { answer }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, count)
}

/// `register`'s arguments for datanode 7 at the member at `addr`.
fn register_args(addr: String, file: std::path::PathBuf, prune: bool) -> RegisterArgs {
    RegisterArgs {
        client: ClientArgs {
            server: addr,
            token: None,
            member_token: None,
            tls_ca: None,
        },
        datanode: 7,
        file,
        prune,
    }
}

/// A shards file without an epoch takes the datanode's: one not registered is told to
/// register first, and a lookup refused otherwise (a wrong token, say) is not.
#[tokio::test]
async fn a_datanode_lookup_that_fails_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shards.json");
    std::fs::write(&file, r#"[{"id":1,"generation":1,"size":1}]"#).unwrap();
    let register_at = |status: StatusCode| {
        let file = file.clone();
        async move {
            let (addr, _) = answering(move |_| (status, "{}")).await;
            format!(
                "{:#}",
                register(register_args(addr, file, false))
                    .await
                    .unwrap_err()
            )
        }
    };
    let unknown = register_at(StatusCode::NOT_FOUND).await;
    assert!(
        unknown.contains("datanode 7 is not registered"),
        "{unknown}"
    );
    let refused = register_at(StatusCode::UNAUTHORIZED).await;
    assert!(
        refused.contains("looking up datanode 7's epoch"),
        "{refused}"
    );
    assert!(!refused.contains("register it first"), "{refused}");
}

/// A refused batch says how much of the file went before it: none, for the first.
#[tokio::test]
async fn a_refused_first_batch_says_none_was_registered() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shards.json");
    std::fs::write(&file, r#"[{"id":1,"generation":1,"size":1}]"#).unwrap();
    let (addr, _) = answering(|n| match n {
        0 => (
            StatusCode::OK,
            r#"{"id":7,"addr":"10.0.0.7:9000","epoch":3,"shards":1,"removing":true}"#,
        ),
        _ => (
            StatusCode::CONFLICT,
            r#"{"error":{"code":"fenced","message":"datanode 7: epoch 3 is fenced (the datanode is being removed)"}}"#,
        ),
    })
    .await;
    let e = format!(
        "{:#}",
        register(register_args(addr, file, false))
            .await
            .unwrap_err()
    );
    assert!(
        e.contains("none of the file's 1 shards was registered"),
        "{e}"
    );
    assert!(e.contains("being removed"), "{e}");
}

/// `register` rides out a cluster without a leader (503) in each of its requests: the epoch
/// lookup, the batches and the prune; with `--prune`, an empty file is a datanode that holds
/// nothing.
#[tokio::test]
async fn register_rides_out_a_cluster_without_a_leader() {
    const NO_LEADER: (StatusCode, &str) = (
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"error":{"code":"no_leader","message":"no leader is known"}}"#,
    );
    const DATANODE: (StatusCode, &str) = (
        StatusCode::OK,
        r#"{"id":7,"addr":"10.0.0.7:9000","epoch":3,"shards":1}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let register_from =
        |text: &'static str, prune: bool, answer: fn(usize) -> (StatusCode, &'static str)| {
            let file = dir.path().join("shards.json");
            async move {
                std::fs::write(&file, text).unwrap();
                let (addr, count) = answering(answer).await;
                let args = register_args(addr, file, prune);
                register(args).await.map(|()| count.load(Ordering::SeqCst))
            }
        };
    // Lookup, batch: each refused once first.
    let asked = register_from(
        r#"[{"id":1,"generation":1,"size":1}]"#,
        false,
        |n| match n {
            0 | 2 => NO_LEADER,
            1 => DATANODE,
            _ => (
                StatusCode::OK,
                r#"{"accepted":1,"unchanged":0,"stale":[],"index":9}"#,
            ),
        },
    )
    .await
    .unwrap();
    assert_eq!(asked, 4);
    // Lookup, prune, with an empty file.
    let asked = register_from("\n", true, |n| match n {
        0 | 2 => NO_LEADER,
        1 => DATANODE,
        _ => (StatusCode::OK, r#"{"removed":1,"index":9}"#),
    })
    .await
    .unwrap();
    assert_eq!(asked, 4);
}

/// A request that no member given could answer names how many were tried, not only the
/// last one.
#[tokio::test]
async fn a_request_no_member_answered_says_all_were_tried() {
    let closed = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let op = operator(format!("{},{}", closed(), closed()));
    let e = op
        .send(|| op.request(reqwest::Method::GET, "/v1/cluster"))
        .await
        .unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("the last of the 2 members given"), "{text}");
}

/// A member that answered 503 before the last one given could not be reached is named with its
/// answer: the last one's refused connection alone would hide why the first did not take it.
#[tokio::test]
async fn a_request_no_member_took_names_each_members_answer() {
    let (leaderless, _) = answering(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":"no_leader","message":"no leader was elected for 9 ms"}}"#,
        )
    })
    .await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let op = operator(format!("{leaderless},{closed}"));
    let e = op
        .send(|| op.request(reqwest::Method::GET, "/v1/cluster"))
        .await
        .unwrap_err();
    let text = format!("{e:#}");
    assert!(
        text.contains(&format!("{leaderless} answered 503")),
        "{text}"
    );
    assert!(text.contains("no leader was elected for 9 ms"), "{text}");
}

/// A read that a member takes and does not answer (a paused process) is asked of the next
/// member given too once the first was silent for 5 s, rather than waiting out its 70 s; the
/// member that answered is asked first by the command's next read.
#[tokio::test]
async fn a_read_a_silent_member_holds_is_asked_of_the_next_too() {
    // Takes connections and never answers; holds them until the test ends.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = listener.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let (answering, count) = answering(|_| (StatusCode::OK, "{}")).await;
    let op = operator(format!("{silent},{answering}"));
    for asked in 1..=2 {
        let read = op.send(|| op.request(reqwest::Method::GET, "/v1/cluster"));
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), read)
            .await
            .expect("answered well before the silent member's 70 s")
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(count.load(Ordering::SeqCst), asked);
        assert_eq!(op.member(), format!("http://{answering}"));
    }
    held.abort();
}

pub(super) fn operator_args(addr: String) -> ClientArgs {
    ClientArgs {
        server: addr,
        token: None,
        member_token: None,
        tls_ca: None,
    }
}

fn operator(addr: String) -> Operator {
    Operator::new(&ClientArgs {
        server: addr,
        token: None,
        member_token: None,
        tls_ca: None,
    })
    .unwrap()
}

/// Sent again without a leader (503), and when the outcome is unknown (504: its leader
/// crashed while it ran; the callers send only requests that apply once).
#[tokio::test]
async fn requests_are_sent_again_without_a_leader_or_an_outcome_and_not_after_a_refusal() {
    let (addr, count) = server(|n| match n {
        0 => StatusCode::SERVICE_UNAVAILABLE,
        1 => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::OK,
    })
    .await;
    let op = operator(addr);
    op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert_eq!(
        op.resent_after_unknown(),
        1,
        "the 504's attempt may have applied"
    );
    // A 503 says nothing was done: sent again, the answer is the whole outcome.
    let (addr, _) = server(|n| match n {
        0 => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    })
    .await;
    let op = operator(addr);
    op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap();
    assert_eq!(op.resent_after_unknown(), 0);

    let (addr, count) = server(|_| StatusCode::CONFLICT).await;
    let op = operator(addr);
    let err = op
        .send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("409"), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 1, "a refusal is not retried");
}

/// An address nothing listens at: connections to it are refused, as to a stopped member.
/// The socket keeps it bound (without listening) so that no other test takes it.
pub(super) fn closed_port() -> (String, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap().to_string(), socket)
}

/// With several members, a request that one cannot answer (it is down, or serves no
/// cluster) goes to the next, whether it is sent until it is answered or once; the only
/// member that serves no cluster (503 without `Retry-After`) is not asked again.
#[tokio::test]
async fn a_request_goes_to_the_next_member_when_one_cannot_answer() {
    let (ok, ok_count) = server(|_| StatusCode::OK).await;
    let (down, _kept) = closed_port();
    let op = operator(format!("{down},{ok}"));
    op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap();
    assert_eq!(ok_count.load(Ordering::SeqCst), 1);
    assert_eq!(
        op.member(),
        format!("http://{ok}"),
        "it stays with the one that answers"
    );
    // So does a request that is sent once (status, a listing, a registration).
    let op = operator(format!("{down},{ok}"));
    let _: Value = op.get_json("/v1/cluster").await.unwrap();
    assert_eq!(ok_count.load(Ordering::SeqCst), 2);
    let err = operator(down.clone())
        .get_json::<Value>("/v1/cluster")
        .await;
    assert!(
        format!("{:#}", err.unwrap_err()).contains(&down),
        "names the member"
    );

    let removed = || {
        let body = r#"{"error":{"code":"no_leader","message":"removed"}}"#;
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    };
    let (alone, count) = answering_with(move |_| removed()).await;
    let op = operator(alone.clone());
    let refused = op
        .answer_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap()
        .expect_err("refused");
    assert_eq!(refused.code(), Some("no_leader"));
    assert_eq!(count.load(Ordering::SeqCst), 1, "not asked again");

    let (ok, ok_count) = server(|_| StatusCode::OK).await;
    let op = operator(format!("{alone},{ok}"));
    op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap();
    assert_eq!(ok_count.load(Ordering::SeqCst), 1);
}

/// A request cut off before its answer (the member went away) is sent again, as a 504 is.
#[tokio::test]
async fn a_request_cut_off_before_its_answer_is_sent_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (ok_addr, ok_count) = server(|_| StatusCode::OK).await;
    let cut = Arc::new(AtomicUsize::new(0));
    let cuts = cut.clone();
    tokio::spawn(async move {
        // The first connection is cut; later ones are passed to a member that answers.
        let (first, _) = listener.accept().await.unwrap();
        cuts.fetch_add(1, Ordering::SeqCst);
        drop(first);
        while let Ok((mut conn, _)) = listener.accept().await {
            let ok_addr = ok_addr.clone();
            tokio::spawn(async move {
                let mut upstream = tokio::net::TcpStream::connect(ok_addr).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
            });
        }
    });
    let op = operator(addr);
    op.send_retrying(|| op.request(reqwest::Method::PUT, "/x"))
        .await
        .unwrap();
    assert_eq!(
        (cut.load(Ordering::SeqCst), ok_count.load(Ordering::SeqCst)),
        (1, 1)
    );
    assert_eq!(
        op.resent_after_unknown(),
        1,
        "the cut attempt may have applied"
    );
}

#[tokio::test]
async fn a_failed_batch_says_how_far_the_registration_got() {
    let (addr, count) = answering(|n| match n {
        0 => (
            StatusCode::OK,
            r#"{"accepted":9000,"unchanged":1000,"stale":[],"index":7}"#,
        ),
        _ => (StatusCode::CONFLICT, r#"{"error":{"code":"fenced"}}"#),
    })
    .await;
    let op = operator(addr);
    let shards: Vec<ShardBody> = (0..MAX_SHARDS_PER_BATCH as u64 + 5)
        .map(|id| ShardBody {
            id,
            generation: 1,
            size: 1,
        })
        .collect();
    let err = register_batches(&op, 7, 3, &shards).await.unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("registered 10000 of 10005 shards (9000 accepted, 1000 unchanged)"),
        "{message}"
    );
    assert!(message.contains("409"), "{message}");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_watch_gives_back_the_history_its_index_counts_in() {
    // A member that counts in history "aaaa" refuses an index given without it (as a
    // restored cluster's member refuses the old cluster's), and answers one given with it.
    let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
        let query = uri.query().unwrap_or_default().to_owned();
        if !query.contains("after=") {
            (
                StatusCode::OK,
                r#"{"index":5,"history":"aaaa","events":[]}"#,
            )
        } else if query.contains("history=aaaa") {
            (
                StatusCode::OK,
                r#"{"index":6,"history":"aaaa","events":[{"index":6,"kind":"kv_put","key":"k"}]}"#,
            )
        } else {
            (
                StatusCode::GONE,
                r#"{"error":{"code":"compacted","message":"no history given"}}"#,
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    // The first member given is down: the watch moves on to the next.
    let (down, _kept) = closed_port();
    let args = WatchArgs {
        client: ClientArgs {
            server: format!("{down},{addr}"),
            token: None,
            member_token: None,
            tls_ca: None,
        },
        after: None,
        history: None,
        datanode: None,
        prefix: None,
        once: true,
    };
    watch(args.clone()).await.unwrap();
    // A member that takes connections but never answers (a paused process) holds the start
    // only a moment: changes made meanwhile would come before it, and never be printed.
    let paused = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut args = args;
    args.client.server = format!("{},{addr}", paused.local_addr().unwrap());
    tokio::time::timeout(std::time::Duration::from_secs(20), watch(args))
        .await
        .expect("the watch waited on the paused member")
        .unwrap();
}

/// `metaserver liveness` follows the report's pages and prints them as one.
#[tokio::test]
async fn the_liveness_report_is_read_page_after_page() {
    let entry = |id: u64| {
        format!(
            r#"{{"id":{id},"addr":"h:1","epoch":1,"shards":0,"state":"alive","heard_ms_ago":5}}"#
        )
    };
    let first = format!(
        r#"{{"leader_id":1,"timeout_ms":10,"collecting_ms":1,"datanodes":[{},{}],"next":"0000000000000004"}}"#,
        entry(3),
        entry(4)
    );
    let last = format!(
        r#"{{"leader_id":1,"timeout_ms":10,"collecting_ms":2,"datanodes":[{}],"next":null}}"#,
        entry(9)
    );
    // Each page is answered only to the question that names where it starts.
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let answer = match uri.query() {
            Some("limit=10000") => (StatusCode::OK, first.clone()),
            Some("limit=10000&after=0000000000000004") => (StatusCode::OK, last.clone()),
            _ => (StatusCode::BAD_REQUEST, format!("unexpected {uri}")),
        };
        async move { answer }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let report = liveness_report(&operator(addr)).await.unwrap();
    let ids: Vec<u64> = report.datanodes.iter().map(|d| d.id).collect();
    assert_eq!(ids, [3, 4, 9]);
    assert_eq!((report.collecting_ms, report.next), (2, None));
}

/// `member promote` asks again while the leader answers 409 (the learner catches up), and
/// stops at once at another refusal, or once its wait is over.
#[tokio::test]
async fn a_promotion_waits_for_the_learner_to_catch_up() {
    let view = r#"{"voters":[1,4],"joint":null,"learners":[]}"#;
    let (addr, asked) = answering(move |n| match n {
        0 | 1 => (
            StatusCode::CONFLICT,
            r#"{"error":{"code":"conflict","message":"learner 4 cannot become a voter yet"}}"#,
        ),
        _ => (StatusCode::OK, view),
    })
    .await;
    let long = std::time::Duration::from_secs(60);
    let promoted = membership::promote(&operator(addr), 4, long).await.unwrap();
    assert_eq!(promoted.voters, vec![1, 4]);
    assert_eq!(asked.load(Ordering::SeqCst), 3);

    let (addr, asked) = answering(|_| (StatusCode::BAD_REQUEST, "{}")).await;
    membership::promote(&operator(addr), 4, long)
        .await
        .unwrap_err();
    assert_eq!(asked.load(Ordering::SeqCst), 1, "a 400 is not asked again");

    let (addr, asked) = answering(|_| (StatusCode::CONFLICT, "{}")).await;
    let e = membership::promote(&operator(addr), 4, std::time::Duration::ZERO)
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("making node 4 a voter"), "{e:#}");
    assert_eq!(asked.load(Ordering::SeqCst), 1, "no wait: asked once");
}

/// A watch whose only member says waiting does not help (503 without `Retry-After`: removed
/// from its cluster) stops with that member's error, instead of asking every second for ever.
#[tokio::test]
async fn a_watch_of_a_lone_member_that_serves_no_cluster_stops() {
    let removed =
        r#"{"error":{"code":"no_leader","message":"this node was removed from the cluster"}}"#;
    let (addr, asked) =
        answering_with(move |_| (StatusCode::SERVICE_UNAVAILABLE, removed).into_response()).await;
    let args = WatchArgs {
        client: ClientArgs {
            server: addr,
            token: None,
            member_token: None,
            tls_ca: None,
        },
        after: Some(1),
        history: None,
        datanode: None,
        prefix: None,
        once: true,
    };
    let e = tokio::time::timeout(std::time::Duration::from_secs(30), watch(args))
        .await
        .expect("the watch stops")
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("removed from the cluster"),
        "{e:#}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

/// A token no header can carry is refused before anything is sent, naming the setting.
#[test]
fn a_token_with_blanks_around_it_is_refused_naming_it() {
    for (token, member, what) in [
        (Some("abc\n"), None, "--token"),
        (None, Some(" m"), "--member-token"),
        (Some("a b"), None, "--token"),
    ] {
        let args = ClientArgs {
            server: "127.0.0.1:1".into(),
            token: token.map(str::to_owned),
            member_token: member.map(str::to_owned),
            tls_ca: None,
        };
        let err = format!("{:#}", Operator::new(&args).err().unwrap());
        assert!(err.contains(what) && err.contains("blanks"), "{err}");
    }
}

/// A watch of the members `server` resuming after index 4 of history "aaaa", ending at its
/// first answer with events.
fn resuming_watch(server: String) -> WatchArgs {
    WatchArgs {
        client: ClientArgs {
            server,
            token: None,
            member_token: None,
            tls_ca: None,
        },
        after: Some(4),
        history: Some("aaaa".into()),
        datanode: None,
        prefix: None,
        once: true,
    }
}

/// A member restarted since the index (410 `compacted`) sends the watch to the next member
/// given, which may still hold it; when every member refuses the index, the watch ends.
#[tokio::test]
async fn a_watch_refused_as_compacted_asks_the_next_member() {
    let compacted = || {
        (
            StatusCode::GONE,
            r#"{"error":{"code":"compacted","message":"this member keeps those after 9"}}"#,
        )
            .into_response()
    };
    let (restarted, asked_restarted) = answering_with(move |_| compacted()).await;
    let (holding, asked_holding) = answering_with(|_| {
        (
            StatusCode::OK,
            r#"{"index":6,"history":"aaaa","events":[{"index":6,"kind":"kv_put","key":"k"}]}"#,
        )
            .into_response()
    })
    .await;
    let args = resuming_watch;
    let bounded = std::time::Duration::from_secs(30);
    tokio::time::timeout(bounded, watch(args(format!("{restarted},{holding}"))))
        .await
        .expect("the watch ends")
        .unwrap();
    assert_eq!(asked_restarted.load(Ordering::SeqCst), 1);
    assert_eq!(asked_holding.load(Ordering::SeqCst), 1);

    let (other, asked_other) = answering_with(move |_| compacted()).await;
    let e = tokio::time::timeout(bounded, watch(args(format!("{restarted},{other}"))))
        .await
        .expect("the watch ends")
        .unwrap_err();
    assert!(format!("{e:#}").contains("keeps those after 9"), "{e:#}");
    assert_eq!(asked_restarted.load(Ordering::SeqCst), 2);
    assert_eq!(asked_other.load(Ordering::SeqCst), 1);
}

/// A member that refused the index (410 `compacted`) is not asked again while another cannot
/// answer yet (restarting: 503): the watch waits for that one, instead of ending at the
/// first member's second refusal.
#[tokio::test]
async fn a_watch_refused_as_compacted_waits_for_a_member_that_cannot_answer_yet() {
    let (restarted, asked_restarted) = answering_with(|_| {
        (
            StatusCode::GONE,
            r#"{"error":{"code":"compacted","message":"this member keeps those after 9"}}"#,
        )
            .into_response()
    })
    .await;
    let (starting, asked_starting) = answering_with(|n| {
        if n < 2 {
            let busy = r#"{"error":{"code":"no_leader","message":"starting"}}"#;
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "1")],
                busy,
            )
                .into_response()
        } else {
            let page =
                r#"{"index":6,"history":"aaaa","events":[{"index":6,"kind":"kv_put","key":"k"}]}"#;
            (StatusCode::OK, page).into_response()
        }
    })
    .await;
    let args = resuming_watch(format!("{restarted},{starting}"));
    tokio::time::timeout(std::time::Duration::from_secs(30), watch(args))
        .await
        .expect("the watch ends")
        .unwrap();
    assert_eq!(asked_restarted.load(Ordering::SeqCst), 1);
    assert_eq!(asked_starting.load(Ordering::SeqCst), 3);
}
