//! Tests of the HTTP Raft transport.

use super::*;

fn timeout() -> RPCError<TypeConfig> {
    RPCError::Timeout(Timeout {
        action: RPCTypes::AppendEntries,
        id: 1,
        target: 2,
        timeout: Duration::from_millis(1),
    })
}

/// Serves `app` on a loopback port; returns its address.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The network of node 1, and the data dir its config names.
fn network_of_node_1() -> (tempfile::TempDir, HttpNetwork) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = meta_consensus::NodeConfig::new(1, "127.0.0.1:1", dir.path());
    (dir, HttpNetwork::new(&cfg, Token::new(None)))
}

/// A peer's heartbeat answers (in time, on a connection of their own) leave the patience
/// that an append which ran out of time earned alone: the resend gets twice the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_leave_an_appends_patience_alone() {
    use axum::body::Body;
    use axum::routing::post;
    use meta_consensus::{Command, Entry, LogId, Node, Vote};
    use openraft::vote::leader_id_adv::LeaderId;

    // A peer that answers an entry-less request at once and one with entries after
    // 3 s: more than a deadline of 2 s, less than twice that (a second of margin either
    // way for a loaded machine).
    const SLOW: Duration = Duration::from_secs(3);
    let app = axum::Router::new().route(
        PATH_APPEND_STREAM,
        post(|body: Body| async move {
            let answers =
                frames(body.into_data_stream(), MAX_RAFT_BODY_BYTES).then(|frame| async move {
                    let rpc: AppendEntriesRequest<TypeConfig> =
                        codec::decode(&frame.unwrap()).unwrap();
                    if !rpc.entries.is_empty() {
                        tokio::time::sleep(SLOW).await;
                    }
                    let last = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
                    let answer: Result<StreamAppendResult<TypeConfig>, String> = Ok(Ok(last));
                    crate::frame::encode_frame(&answer).map_err(std::io::Error::other)
                });
            Body::from_stream(answers)
        }),
    );
    let (_dir, mut network) = network_of_node_1();
    let peer = Node::new(serve(app).await);
    let mut replication = network.new_client(2, &peer).await;
    let mut heartbeats = network.new_client(2, &peer).await;
    // A soft deadline of two seconds.
    let option = RPCOption::new(Duration::from_millis(2667));
    let vote = Vote::new_committed(1, 1);
    let id = |index| {
        LogId::new(
            LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        )
    };
    let append = || AppendEntriesRequest {
        vote,
        prev_log_id: None,
        entries: vec![Entry {
            log_id: id(1),
            payload: openraft::EntryPayload::Normal(Command::Delete {
                key: "k".into(),
                if_revision: None,
            }),
        }],
        leader_commit: None,
    };
    async fn first(mut stream: BoxStream<'_, StreamAnswer>) -> StreamAnswer {
        stream.next().await.expect("an answer")
    }

    let answer = first(
        replication
            .stream_append(futures::stream::iter([append()]), option.clone())
            .await
            .unwrap(),
    )
    .await;
    assert!(matches!(answer, Err(RPCError::Timeout(_))), "{answer:?}");
    let heartbeat = AppendEntriesRequest {
        vote,
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let answer = first(
        heartbeats
            .stream_append(futures::stream::iter([heartbeat]), option.clone())
            .await
            .unwrap(),
    )
    .await;
    assert!(answer.is_ok(), "{answer:?}");
    let answer = first(
        replication
            .stream_append(futures::stream::iter([append()]), option)
            .await
            .unwrap(),
    )
    .await;
    assert!(
        answer.is_ok(),
        "the resend had no more time than the first attempt: {answer:?}"
    );
}

/// A peer that refuses a request (another cluster, another node, another token) is
/// unreachable to openraft, which backs off; a failure of the peer's own is a network error.
/// A refused vote request is a vote not given, not a failure: openraft warned of each as an
/// unreachable node (several a second from a member with a wrong token, and at each restart
/// from members that keep a leader's lease).
#[tokio::test]
async fn a_refused_request_is_unreachable_and_a_refused_vote_is_no_vote() {
    use axum::routing::post;
    use meta_consensus::{Node, Vote};

    let not_voting: RemoteResult<()> = Err("not voting: a lease".into());
    let not_voting = codec::encode(&not_voting).unwrap();
    let app = axum::Router::new()
        .route(
            PATH_VOTE,
            post(|| async { (axum::http::StatusCode::UNAUTHORIZED, "token") }),
        )
        .route(PATH_PRE_VOTE, post(move || async move { not_voting }))
        .route(
            PATH_TRANSFER_LEADER,
            post(|| async { (axum::http::StatusCode::CONFLICT, "other_cluster") }),
        );
    let (_dir, mut network) = network_of_node_1();
    let mut peer = network.new_client(2, &Node::new(serve(app).await)).await;
    let option = RPCOption::new(Duration::from_secs(5));
    let rpc = VoteRequest::new(Vote::new(2, 1), None);
    for (kind, answer) in [
        ("vote", peer.vote(rpc.clone(), option.clone()).await),
        ("pre-vote", peer.pre_vote(rpc.clone(), option.clone()).await),
    ] {
        match answer {
            // The least vote: openraft adopts one higher than the candidate's own, which the
            // network does not know (a pre-vote's is the candidate's next term).
            Ok(r) => assert!(
                !r.vote_granted && r.vote == Vote::new(0, 0),
                "{kind}: {r:?}"
            ),
            Err(e) => panic!("a refused {kind} is a failure: {e:?}"),
        }
    }
    let transfer = TransferLeaderRequest::new(Vote::new_committed(2, 1), 2, None);
    let refused = peer.transfer_leader(transfer, option.clone()).await;
    assert!(
        matches!(refused, Err(RPCError::Unreachable(_))),
        "{refused:?}"
    );
    // No answer is no vote either.
    let down = crate::refused_port::RefusedPort::new();
    let addr = format!("127.0.0.1:{}", down.port);
    let mut absent = network.new_client(3, &Node::new(addr)).await;
    match absent.vote(rpc.clone(), option.clone()).await {
        Ok(r) => assert!(!r.vote_granted && r.vote == Vote::new(0, 0), "{r:?}"),
        Err(e) => panic!("a vote nobody answered is a failure: {e:?}"),
    }
    // A failure of the peer's own is a network error, for a vote too.
    let app = axum::Router::new().route(
        PATH_VOTE,
        post(|| async { (axum::http::StatusCode::BAD_GATEWAY, "broken") }),
    );
    let mut peer = network.new_client(2, &Node::new(serve(app).await)).await;
    let failed = peer.vote(rpc, option).await;
    assert!(matches!(failed, Err(RPCError::Network(_))), "{failed:?}");
}

#[test]
fn patience_doubles_per_timeout_up_to_its_cap() {
    let p = Patience::default();
    let option = RPCOption::new(Duration::from_millis(100));
    let base = rpc_timeout(&option, 1 << 20);
    assert_eq!(p.deadline(&option, 1 << 20), base);
    let mut seen = Vec::new();
    for _ in 0..5 {
        p.record::<()>(&Err(timeout()));
        seen.push(p.deadline(&option, 1 << 20));
    }
    assert_eq!(seen, [2, 4, 8, 8, 8].map(|k| base * k));
    // Other failures change nothing; an answer in time starts over.
    p.record::<()>(&Err(RPCError::Unreachable(Unreachable::from_string("x"))));
    assert_eq!(p.deadline(&option, 1 << 20), base * 8);
    p.record(&Ok(()));
    assert_eq!(p.deadline(&option, 1 << 20), base);
}
