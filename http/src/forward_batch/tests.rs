//! Tests of forwarded-write batching: grouping, per-write answers and refusals, stalled or
//! unreachable leaders, and decoding a leader's refusals.

use super::*;
use axum::routing::post;
use axum::Router;
use futures::FutureExt;
use meta_consensus::CommandResult;

/// The index a stand-in leader answers for the write of key `w<N>`: 100 + N.
fn index_of(cmd: &Command) -> u64 {
    match cmd {
        Command::Put { key, .. } => 100 + key[1..].parse::<u64>().unwrap(),
        other => panic!("unexpected command {other}"),
    }
}

/// A stand-in leader that reports each batch's keys, holds its answer until released,
/// then answers every write as written at [`index_of`], except key `w13`, which it
/// refuses as a node that does not lead would.
async fn fake_leader() -> (String, mpsc::UnboundedReceiver<Vec<String>>, Arc<Semaphore>) {
    let (seen_tx, seen_rx) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let gate = release.clone();
    let app = Router::new().route(
        PATH_FORWARD_BATCH,
        post(move |body: Bytes| {
            let seen = seen_tx.clone();
            let gate = gate.clone();
            async move {
                let commands: Vec<Command> = codec::decode(&body).unwrap();
                let keys = commands
                    .iter()
                    .map(|c| match c {
                        Command::Put { key, .. } => key.clone(),
                        other => panic!("unexpected command {other}"),
                    })
                    .collect();
                seen.send(keys).unwrap();
                gate.acquire().await.unwrap().forget();
                let answers: Vec<Answer> = commands
                    .iter()
                    .map(|c| match index_of(c) {
                        113 => Err(Refusal::of(meta_consensus::Error::ForwardToLeader {
                            leader_id: 3,
                            leader_addr: "127.0.0.1:1".into(),
                        })),
                        index => Ok(Written {
                            index,
                            result: CommandResult::Empty,
                        }),
                    })
                    .collect();
                codec::encode(&answers).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen_rx, release)
}

/// The next thing the stand-in leader saw; fails the test if it saw nothing within 10 s.
async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the stand-in leader heard nothing in time")
        .expect("the stand-in leader is gone")
}

fn write(i: u64) -> Command {
    Command::Put {
        key: format!("w{i}"),
        value: b"v".to_vec(),
        if_revision: None,
    }
}

/// The refusals of a build that predates versions, as it decodes them.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
enum RefusalOfVersion1 {
    NoLeader(String),
    Unavailable(String),
    Timeout(String),
    OutcomeUnknown(String),
    Invalid(String),
    NotFound(String),
    Internal(String),
    InsufficientStorage(String),
}

#[test]
fn a_member_of_an_older_build_gets_refusals_it_decodes() {
    let refused = || Refusal::ClusterVersion("node 3 runs a build of version 1".into());
    let decode = |r: Refusal| {
        let answers: Vec<Answer> = vec![Err(r)];
        let bytes = codec::encode(&answers).unwrap();
        codec::decode::<Vec<Result<Written, RefusalOfVersion1>>>(&bytes)
    };
    let old = decode(refused().for_build(1)).unwrap();
    assert!(
        matches!(&old[..], [Err(RefusalOfVersion1::Unavailable(m))] if m.contains("node 3")),
        "{old:?}"
    );
    // Sent as it is, the refusal would fail the whole batch's answer there.
    assert!(decode(refused().for_build(2)).is_err());
    assert_eq!(refused().for_build(2), refused());
}

fn batcher(timeout: Duration) -> Batcher {
    Batcher::new(
        2,
        meta_consensus::BUILD_VERSION,
        ClusterId::default(),
        crate::PeerClient::plain(),
        Token::new(None),
        timeout,
    )
}

#[tokio::test]
async fn writes_queued_behind_busy_batches_go_together_and_get_their_own_answers() {
    let (addr, mut seen, release) = fake_leader().await;
    let target = ForwardTo { leader_id: 1, addr };
    let b = batcher(Duration::from_secs(30));
    let mut first = Box::pin(b.send(target.clone(), write(0)));
    assert!((&mut first).now_or_never().is_none());
    // The first write leaves alone; with one more batch allowed out, the next write leaves
    // at once too, and takes the writes queued behind it.
    assert_eq!(next(&mut seen).await, vec!["w0".to_string()]);
    let mut rest: Vec<_> = (1..5)
        .map(|i| Box::pin(b.send(target.clone(), write(i))))
        .collect();
    for f in &mut rest {
        assert!(f.now_or_never().is_none(), "queued, not answered");
    }
    let second = next(&mut seen).await;
    assert_eq!(second, (1..5).map(|i| format!("w{i}")).collect::<Vec<_>>());
    release.add_permits(2);
    assert_eq!(first.await.unwrap().index, 100);
    for (i, f) in rest.into_iter().enumerate() {
        assert_eq!(f.await.unwrap().index, 101 + i as u64);
    }
}

#[tokio::test]
async fn a_refused_write_gets_its_refusal_and_the_others_of_its_batch_their_answers() {
    let (addr, mut seen, release) = fake_leader().await;
    let target = ForwardTo { leader_id: 1, addr };
    let b = batcher(Duration::from_secs(30));
    // Two slots taken, so the next three go together.
    let mut busy: Vec<_> = (0..2)
        .map(|i| Box::pin(b.send(target.clone(), write(i))))
        .collect();
    for f in &mut busy {
        assert!(f.now_or_never().is_none());
        next(&mut seen).await;
    }
    let mut batch: Vec<_> = (12..15)
        .map(|i| Box::pin(b.send(target.clone(), write(i))))
        .collect();
    for f in &mut batch {
        assert!(f.now_or_never().is_none());
    }
    release.add_permits(3);
    assert_eq!(next(&mut seen).await, vec!["w12", "w13", "w14"]);
    let answers = futures::future::join_all(batch).await;
    assert_eq!(answers[0].as_ref().unwrap().index, 112);
    let refused = answers[1].as_ref().unwrap_err();
    assert_eq!(
        (refused.status().as_u16(), refused.code()),
        (503, "no_leader"),
        "{refused}"
    );
    assert_eq!(answers[2].as_ref().unwrap().index, 114);
}

/// The leader (node 1) at `addr`.
fn to(addr: &str) -> ForwardTo {
    ForwardTo {
        leader_id: 1,
        addr: addr.to_string(),
    }
}

/// A forwarded write under way.
type Pending<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Written, ApiError>> + Send + 'a>>;

/// Sends the writes `keys` to `target` one at a time, each once the previous one's batch
/// reached the stand-in leader (so each leaves in a batch of its own), and returns them.
async fn one_batch_each<'a>(
    b: &'a Batcher,
    target: &ForwardTo,
    keys: std::ops::Range<u64>,
    seen: &mut mpsc::UnboundedReceiver<Vec<String>>,
) -> Vec<Pending<'a>> {
    let mut out: Vec<Pending<'a>> = Vec::new();
    for i in keys {
        let mut w: Pending<'a> = Box::pin(b.send(target.clone(), write(i)));
        assert!((&mut w).now_or_never().is_none());
        let keys = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .expect("a batch with a place goes");
        assert_eq!(keys.unwrap(), vec![format!("w{i}")]);
        out.push(w);
    }
    out
}

/// Waits until a batch waits for a place at the leader at `addr`, every place taken: its
/// semaphore is then held by the map, the places taken, the waiting batch and this.
async fn parked_at(b: &Batcher, addr: &str) {
    let places = b.link.places_at(addr);
    let parked = async {
        while Arc::strong_count(&places) < 1 + MAX_OUT_PER_LEADER + 1 + 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), parked)
        .await
        .expect("the batch past the cap waits for a place");
    assert_eq!(places.available_permits(), 0);
}

#[tokio::test]
async fn batches_stuck_at_a_silent_leader_do_not_hold_back_writes_for_another() {
    let (silent, mut seen, _never) = fake_leader().await;
    let (live, _seen_live, release) = fake_leader().await;
    release.add_permits(1);
    let b = batcher(Duration::from_secs(300));
    // Both slots go to batches the silent leader never answers.
    let _stuck = one_batch_each(&b, &to(&silent), 0..2, &mut seen).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), b.send(to(&live), write(7)))
        .await
        .expect("the write for the live leader is answered");
    assert_eq!(answer.unwrap().index, 107);
}

#[tokio::test]
async fn a_silent_leader_holds_at_most_so_many_batches_of_one_follower() {
    let (silent, mut seen, release) = fake_leader().await;
    let (live, _seen_live, live_release) = fake_leader().await;
    live_release.add_permits(1);
    let b = batcher(Duration::from_secs(300));
    // One write at a time, each once the previous batch has reached the leader: every one
    // leaves in a batch of its own, the first two in the slots, the rest without. (Keys from
    // w20: the stand-in refuses w13.)
    let cap = MAX_OUT_PER_LEADER as u64;
    let out = one_batch_each(&b, &to(&silent), 20..20 + cap, &mut seen).await;
    let mut waiting = Box::pin(b.send(to(&silent), write(50)));
    assert!((&mut waiting).now_or_never().is_none());
    parked_at(&b, &silent).await;
    assert!(seen.try_recv().is_err(), "a batch past the cap went");
    // The cap is per leader: a write for another still goes.
    let answer = tokio::time::timeout(Duration::from_secs(10), b.send(to(&live), write(7)))
        .await
        .expect("the write for the live leader is answered");
    assert_eq!(answer.unwrap().index, 107);
    // One answer frees a place, and the waiting batch takes it.
    release.add_permits(1);
    let keys = tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("the waiting batch goes once a place is free");
    assert_eq!(keys.unwrap(), vec!["w50".to_string()]);
    release.add_permits(MAX_OUT_PER_LEADER);
    for (i, w) in out.into_iter().enumerate() {
        assert_eq!(w.await.unwrap().index, 120 + i as u64);
    }
    assert_eq!(waiting.await.unwrap().index, 150);
}

#[tokio::test]
async fn a_batch_for_two_leaders_sends_each_part_on_its_own() {
    let (silent, mut seen, _never) = fake_leader().await;
    let (live, mut seen_live, release) = fake_leader().await;
    release.add_permits(1);
    let b = batcher(Duration::from_secs(300));
    // Both slots go to batches the silent leader never answers.
    let _stuck = one_batch_each(&b, &to(&silent), 0..2, &mut seen).await;
    // Queued together while the slots are taken: one batch, a part for each leader.
    let mut old = Box::pin(b.send(to(&silent), write(5)));
    assert!((&mut old).now_or_never().is_none());
    let new = b.send(to(&live), write(7));
    let answer = tokio::time::timeout(Duration::from_secs(10), new)
        .await
        .expect("the part for the live leader does not wait for the silent one");
    assert_eq!(answer.unwrap().index, 107);
    assert_eq!(next(&mut seen).await, vec!["w5".to_string()]);
    assert_eq!(next(&mut seen_live).await, vec!["w7".to_string()]);
}

#[tokio::test]
async fn a_write_whose_caller_went_away_while_it_waited_is_not_sent() {
    let (addr, mut seen, release) = fake_leader().await;
    let target = ForwardTo { leader_id: 1, addr };
    let b = batcher(Duration::from_secs(300));
    let cap = MAX_OUT_PER_LEADER as u64;
    let out = one_batch_each(&b, &target, 20..20 + cap, &mut seen).await;
    // Every place is taken: the handles to the places are those of the batches out.
    let places = b.link.places_at(&target.addr);
    let out_only = Arc::strong_count(&places);
    let mut gone = Box::pin(b.send(target.clone(), write(60)));
    assert!((&mut gone).now_or_never().is_none());
    parked_at(&b, &target.addr).await;
    let count_until = |what: &'static str, done: fn(usize, usize) -> bool| {
        let places = places.clone();
        async move {
            let reached = async {
                while !done(Arc::strong_count(&places) - 1, out_only) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), reached)
                .await
                .expect(what);
        }
    };
    count_until("the write's batch waits for a place", |now, out| now > out).await;
    drop(gone);
    // The abandoned write's batch stops waiting at once, no place freed: it holds nothing
    // (a handle to the places, its command) for the rest of the timeout.
    count_until("the abandoned batch still waits for a place", |now, out| {
        now == out
    })
    .await;
    drop(places);
    // The next batch is the next write's.
    release.add_permits(1);
    let next = b.send(target.clone(), write(61));
    let mut next = Box::pin(next);
    assert!((&mut next).now_or_never().is_none());
    let keys = tokio::time::timeout(Duration::from_secs(10), seen.recv())
        .await
        .expect("the next write goes");
    assert_eq!(keys.unwrap(), vec!["w61".to_string()]);
    release.add_permits(MAX_OUT_PER_LEADER + 1);
    assert_eq!(next.await.unwrap().index, 161);
    for w in out {
        w.await.unwrap();
    }
}

#[tokio::test]
async fn an_unreachable_leader_fails_every_write_of_the_batch_with_503() {
    let refused = crate::refused_port::RefusedPort::new();
    let target = ForwardTo {
        leader_id: 1,
        addr: format!("127.0.0.1:{}", refused.port),
    };
    let b = batcher(Duration::from_secs(5));
    let answers = futures::future::join_all((0..3).map(|i| b.send(target.clone(), write(i)))).await;
    for a in answers {
        let e = a.unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (503, "no_leader"), "{e}");
        assert!(e.to_string().contains("unreachable"), "{e}");
    }
}

/// A leader that answers every batch with `status` and `body`.
async fn answering(status: u16, body: &'static [u8]) -> String {
    let app = Router::new().route(
        PATH_FORWARD_BATCH,
        post(move || async move { (axum::http::StatusCode::from_u16(status).unwrap(), body) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// What a member answers for a write by what the leader did with its batch: refused it
/// without acting (another cluster or node at the address, a body too slow: try again,
/// 503; this member's token: ask another, 503), or took it and answered what the member
/// cannot read (it may have acted: 504).
#[tokio::test]
async fn a_leaders_answer_maps_to_whether_it_may_have_acted() {
    let b = batcher(Duration::from_secs(5));
    for (status, body, expected) in [
        (409, &b"{}"[..], (503, "no_leader")),
        (408, &b"{}"[..], (503, "no_leader")),
        // Another token: this member's, which no request through it gets past.
        (401, &b"{}"[..], (503, "unavailable")),
        (200, &b"\xff\xff\xff"[..], (504, "outcome_unknown")),
    ] {
        let target = ForwardTo {
            leader_id: 1,
            addr: answering(status, body).await,
        };
        let e = b.send(target, write(1)).await.unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), expected, "{status}: {e}");
    }
}

#[test]
fn refusals_keep_the_status_and_code_of_the_leaders_error() {
    use meta_consensus::Error as E;
    for (e, status, code) in [
        (E::NoLeader, 503, "no_leader"),
        // A stopped leader leads no more: the sender asks the next one.
        (E::Shutdown, 503, "no_leader"),
        (E::Stopped("a sync failed".into()), 503, "no_leader"),
        // So does a leader that was removed, or whose voters refuse it.
        (E::Removed { members: vec![2] }, 503, "no_leader"),
        (E::RefusedByMembers { refusing: vec![2] }, 503, "no_leader"),
        (E::Timeout, 504, "timeout"),
        (E::OutcomeUnknown("x".into()), 504, "outcome_unknown"),
        (E::InvalidArgument("x".into()), 400, "invalid_argument"),
        (E::NotFound("x".into()), 404, "not_found"),
        (E::Snapshot("x".into()), 500, "internal"),
    ] {
        let refusal = Refusal::of(e);
        let back: Refusal = codec::decode(&codec::encode(&refusal).unwrap()).unwrap();
        let api = ApiError::from(back);
        assert_eq!((api.status().as_u16(), api.code()), (status, code), "{api}");
    }
}

/// A batch goes in parts by leader, and by size: the leader answers an exchange once every
/// write in it is done, so a small write (a key, a registration, a few shards) goes without the
/// batches of a thousand shards queued with it. Each part keeps the order of its writes.
#[test]
fn small_writes_go_to_the_leader_without_large_ones() {
    let shards = |n: u64| Command::RegisterShards {
        datanode: 1,
        epoch: 1,
        shards: (0..n)
            .map(|id| meta_consensus::ShardReport {
                id,
                generation: 1,
                size: 1,
            })
            .collect(),
    };
    assert!(small(&write(1)));
    assert!(small(&shards(u64::from(SMALL_WRITE_WEIGHT))));
    assert!(!small(&shards(u64::from(SMALL_WRITE_WEIGHT) + 1)));
    let batch = vec![
        ("a", write(1)),
        ("a", shards(1_000)),
        ("b", write(2)),
        ("a", shards(2)),
        ("a", shards(500)),
    ];
    let grouped = parts(batch, |(addr, cmd)| (*addr, small(cmd)));
    let shown: Vec<Vec<String>> = grouped
        .iter()
        .map(|part| {
            part.iter()
                .map(|(addr, cmd)| format!("{addr} {cmd}"))
                .collect()
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            vec![
                r#"a Put("w1", if None)"#.to_owned(),
                "a RegisterShards(datanode 1, epoch 1, 2 shards)".to_owned(),
            ],
            vec![
                "a RegisterShards(datanode 1, epoch 1, 1000 shards)".to_owned(),
                "a RegisterShards(datanode 1, epoch 1, 500 shards)".to_owned(),
            ],
            vec![r#"b Put("w2", if None)"#.to_owned()],
        ]
    );
}
