//! Tests of the streamed AppendEntries exchange: the window, the framing of requests and answers,
//! entryless requests standing in, and how a stream ends.

use super::*;
use futures::FutureExt;
use meta_consensus::LogId;
use openraft::errors::Timeout;
use openraft::network::RPCTypes;

fn policy(deadline: Duration) -> AnswerPolicy {
    AnswerPolicy {
        peer: "node 2".into(),
        deadline: Box::new(move |_| deadline),
        timed_out: Box::new(|timeout| {
            RPCError::Timeout(Timeout {
                action: RPCTypes::AppendEntries,
                id: 1,
                target: 2,
                timeout,
            })
        }),
    }
}

/// An exchange whose head has arrived, answering `frames`.
fn connected<F>(frames: F) -> Connecting
where
    F: futures::Stream<Item = Result<Bytes, String>> + Send + 'static,
{
    let frames: Frames = frames.boxed();
    async move { Ok(frames) }.boxed()
}

/// Every answer read from `frames` of an exchange with `outstanding` requests.
async fn all_answers(
    frames: Vec<Result<Bytes, String>>,
    outstanding: Arc<Outstanding>,
) -> Vec<Answer> {
    answers(
        connected(futures::stream::iter(frames)),
        outstanding,
        policy(Duration::from_secs(5)),
    )
    .collect()
    .await
}

/// The matched indexes of the answers read from `frames`, each expected to be a success.
async fn matched_indexes(
    frames: Vec<Result<Bytes, String>>,
    outstanding: Arc<Outstanding>,
) -> Vec<u64> {
    all_answers(frames, outstanding)
        .await
        .into_iter()
        .map(|a| a.unwrap().unwrap().unwrap().index)
        .collect()
}

/// A frame carrying `answer`.
fn answer_frame(answer: &RemoteResult<StreamAppendResult<TypeConfig>>) -> Result<Bytes, String> {
    Ok(codec::encode(answer).unwrap().into())
}

fn ok_frame(index: u64) -> Result<Bytes, String> {
    answer_frame(&Ok(Ok(Some(log_id(index)))))
}

#[test]
fn the_window_opens_when_an_answer_comes() {
    use futures::FutureExt;
    let o = Outstanding::default();
    o.push(1);
    o.push(1);
    assert_eq!(o.below(3).now_or_never(), Some(true));
    assert!(
        o.below(2).now_or_never().is_none(),
        "two of two are unanswered"
    );
    assert!(o.pop().is_some());
    assert_eq!(o.below(2).now_or_never(), Some(true));
}

/// A request stream that never yields and says when it is dropped, like openraft's while
/// it waits for entries (holding its replication state locked).
struct Waiting(Option<tokio::sync::oneshot::Sender<()>>);

impl futures::Stream for Waiting {
    type Item = AppendEntriesRequest<TypeConfig>;
    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Pending
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

fn waiting() -> (Waiting, tokio::sync::oneshot::Receiver<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (Waiting(Some(tx)), rx)
}

#[tokio::test]
async fn a_body_waiting_for_entries_ends_and_lets_go_when_the_answers_are_dropped() {
    let (input, let_go) = waiting();
    let outstanding = Arc::new(Outstanding::default());
    let mut body = Box::pin(requests(input, outstanding.clone(), 8));
    let answers = answers(
        connected(futures::stream::pending()),
        outstanding,
        policy(Duration::from_secs(5)),
    );
    assert!(body.next().now_or_never().is_none(), "waiting for entries");
    drop(answers);
    let end = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
    assert!(matches!(end, Ok(None)), "the body ends");
    let released = tokio::time::timeout(Duration::from_secs(10), let_go).await;
    assert!(released.is_ok(), "openraft's requests are let go");
}

#[tokio::test]
async fn openraft_is_let_go_even_if_nobody_polls_the_body() {
    // A connection whose peer stopped reading never polls its body again.
    let (input, let_go) = waiting();
    let outstanding = Arc::new(Outstanding::default());
    let _body = requests(input, outstanding.clone(), 8);
    let answers = answers(
        connected(futures::stream::pending()),
        outstanding,
        policy(Duration::from_secs(5)),
    );
    drop(answers);
    let released = tokio::time::timeout(Duration::from_secs(10), let_go).await;
    assert!(released.is_ok(), "openraft's requests are let go");
}

#[tokio::test]
async fn requests_are_framed_in_order_within_the_window() {
    let leader = openraft::impls::leader_id_adv::LeaderId {
        term: 1,
        node_id: 1,
    };
    let rpc = move |i: u64| AppendEntriesRequest::<TypeConfig> {
        vote: meta_consensus::Vote::new(1, 1),
        prev_log_id: Some(LogId::new(leader, i)),
        leader_commit: None,
        entries: vec![],
    };
    let outstanding = Arc::new(Outstanding::default());
    let input = futures::stream::iter((0..3).map(rpc));
    let mut body = Box::pin(requests(input, outstanding.clone(), 2));
    for i in 0..2 {
        let frame = body.next().await.unwrap().unwrap();
        let back: AppendEntriesRequest<TypeConfig> = codec::decode(&frame[4..]).unwrap();
        assert_eq!(back.prev_log_id.unwrap().index, i);
    }
    assert_eq!(outstanding.len(), 2);
    assert!(body.next().now_or_never().is_none(), "the window is full");
    assert!(outstanding.pop().is_some());
    let frame = body.next().await.unwrap().unwrap();
    let back: AppendEntriesRequest<TypeConfig> = codec::decode(&frame[4..]).unwrap();
    assert_eq!(back.prev_log_id.unwrap().index, 2);
    // The end of openraft's requests is seen once the window opens again.
    assert!(outstanding.pop().is_some());
    let end = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
    assert!(matches!(end, Ok(None)), "openraft's requests ended");
}

fn log_id(index: u64) -> LogId {
    LogId::new(
        openraft::impls::leader_id_adv::LeaderId {
            term: 1,
            node_id: 1,
        },
        index,
    )
}

/// A request at `prev` carrying `entries` (blank) after it and commit index `commit`.
fn request(prev: u64, entries: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: meta_consensus::Vote::new(1, 1),
        prev_log_id: Some(log_id(prev)),
        leader_commit: Some(log_id(commit)),
        entries: (prev + 1..=prev + entries)
            .map(|i| meta_consensus::Entry {
                log_id: log_id(i),
                payload: openraft::EntryPayload::Blank,
            })
            .collect(),
    }
}

fn decoded(frame: &Bytes) -> AppendEntriesRequest<TypeConfig> {
    codec::decode(&frame[4..]).unwrap()
}

#[tokio::test]
async fn the_next_request_at_its_position_stands_in_for_an_entryless_one() {
    let outstanding = Arc::new(Outstanding::default());
    // openraft: "commit 5" with nothing new, then entry 6 (commit still 5).
    let input = futures::stream::iter(vec![request(5, 0, 5), request(5, 1, 5)]);
    let mut body = Box::pin(requests(input, outstanding.clone(), 2));
    let frame = body.next().await.unwrap().unwrap();
    let sent = decoded(&frame);
    assert_eq!(sent.entries.len(), 1, "the request with the entry went");
    assert_eq!(sent.leader_commit, Some(log_id(5)));
    assert_eq!(outstanding.len(), 1, "one frame for two requests");
    let end = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
    assert!(matches!(end, Ok(None)), "nothing else is sent");
    // Its answer answers both, in order: matched at 5, then at 6.
    let matched = matched_indexes(vec![ok_frame(6)], outstanding.clone()).await;
    assert_eq!(matched, vec![5, 6]);
    assert_eq!(outstanding.len(), 0);
}

#[tokio::test]
async fn a_refusal_of_the_standing_in_request_refuses_the_entryless_one_and_ends() {
    let outstanding = Arc::new(Outstanding::default());
    let input = futures::stream::iter(vec![request(5, 0, 5), request(5, 2, 5)]);
    let mut body = Box::pin(requests(input, outstanding.clone(), 2));
    assert_eq!(
        decoded(&body.next().await.unwrap().unwrap()).entries.len(),
        2
    );
    let end = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
    assert!(matches!(end, Ok(None)), "one frame for two requests");
    let conflict: RemoteResult<StreamAppendResult<TypeConfig>> =
        Ok(Err(openraft::raft::StreamAppendError::Conflict(log_id(5))));
    let got = all_answers(vec![answer_frame(&conflict)], outstanding).await;
    assert!(
        matches!(&got[..], [Ok(Err(openraft::raft::StreamAppendError::Conflict(p)))] if p.index == 5),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_request_at_another_position_does_not_stand_in() {
    let outstanding = Arc::new(Outstanding::default());
    // A new session restarting from 3 (not the entry-less request's position).
    let input = futures::stream::iter(vec![request(5, 0, 5), request(3, 1, 5)]);
    let mut body = Box::pin(requests(input, outstanding.clone(), 1));
    assert_eq!(
        decoded(&body.next().await.unwrap().unwrap()).prev_log_id,
        Some(log_id(5))
    );
    assert!(
        body.next().now_or_never().is_none(),
        "window of one is full"
    );
    assert!(outstanding.pop().is_some());
    let second = decoded(&body.next().await.unwrap().unwrap());
    assert_eq!(
        (second.prev_log_id, second.entries.len()),
        (Some(log_id(3)), 1)
    );
}

#[tokio::test(start_paused = true)]
async fn an_entryless_request_waits_for_company_at_most_the_hold() {
    // Nothing follows: it goes once the hold is over.
    let outstanding = Arc::new(Outstanding::default());
    let input = futures::stream::iter(vec![request(5, 0, 5)]).chain(futures::stream::pending());
    let mut body = Box::pin(requests(input, outstanding.clone(), 1));
    let started = Instant::now();
    assert!(decoded(&body.next().await.unwrap().unwrap())
        .entries
        .is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= HOLD_ENTRYLESS && waited < 2 * HOLD_ENTRYLESS,
        "{waited:?}"
    );
    // A heartbeat (a stream of one request) goes at once.
    let outstanding = Arc::new(Outstanding::default());
    let input = Box::pin(futures::stream::once(async { request(5, 0, 5) }));
    let mut body = Box::pin(requests(input, outstanding, 1));
    let started = Instant::now();
    assert!(decoded(&body.next().await.unwrap().unwrap())
        .entries
        .is_empty());
    assert!(started.elapsed() < HOLD_ENTRYLESS);
}

#[tokio::test]
async fn dropping_the_answers_ends_the_requests() {
    let outstanding = Arc::new(Outstanding::default());
    outstanding.push(1);
    let answers = answers(
        connected(futures::stream::pending()),
        outstanding.clone(),
        policy(Duration::from_secs(5)),
    );
    assert!(outstanding.abandoned().now_or_never().is_none());
    assert!(outstanding.below(1).now_or_never().is_none(), "window full");
    drop(answers);
    assert_eq!(outstanding.below(1).now_or_never(), Some(false));
    assert!(outstanding.abandoned().now_or_never().is_some());
}

#[tokio::test]
async fn answers_come_in_order_and_the_stream_ends_cleanly() {
    let outstanding = Arc::new(Outstanding::default());
    outstanding.push(10);
    outstanding.push(10);
    let indexes = matched_indexes(vec![ok_frame(1), ok_frame(2)], outstanding.clone()).await;
    assert_eq!(indexes, vec![1, 2]);
    assert_eq!(outstanding.len(), 0);
}

#[tokio::test]
async fn an_early_end_an_extra_answer_and_a_remote_failure_are_errors() {
    let outstanding = Arc::new(Outstanding::default());
    outstanding.push(10);
    outstanding.push(10);
    let got: Vec<_> = answers(
        connected(futures::stream::iter(vec![ok_frame(1)])),
        outstanding,
        policy(Duration::from_secs(5)),
    )
    .collect()
    .await;
    assert_eq!(got.len(), 2);
    assert!(
        matches!(&got[1], Err(RPCError::Network(e)) if e.to_string().contains("1 requests unanswered"))
    );

    let got: Vec<_> = answers(
        connected(futures::stream::iter(vec![ok_frame(1)])),
        Arc::new(Outstanding::default()),
        policy(Duration::from_secs(5)),
    )
    .collect()
    .await;
    assert!(matches!(&got[..], [Err(RPCError::Network(_))]), "{got:?}");

    let outstanding = Arc::new(Outstanding::default());
    outstanding.push(10);
    let failure: RemoteResult<StreamAppendResult<TypeConfig>> = Err("shutting down".into());
    let got = all_answers(vec![answer_frame(&failure)], outstanding).await;
    assert!(
        matches!(&got[..], [Err(RPCError::Unreachable(_))]),
        "{got:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_head_that_never_comes_times_out_once_a_request_waits() {
    let outstanding = Arc::new(Outstanding::default());
    let never: Connecting = futures::future::pending().boxed();
    let mut answers = answers(
        never,
        outstanding.clone(),
        policy(Duration::from_millis(200)),
    );
    let idle = tokio::time::timeout(Duration::from_secs(60), answers.next()).await;
    assert!(idle.is_err(), "nothing sent: no deadline");
    outstanding.push(10);
    let answer = answers.next().await.unwrap();
    assert!(matches!(answer, Err(RPCError::Timeout(_))), "{answer:?}");
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_times_out_only_while_a_request_waits() {
    let outstanding = Arc::new(Outstanding::default());
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, String>>();
    let mut answers = answers(
        connected(rx),
        outstanding.clone(),
        policy(Duration::from_millis(200)),
    );
    // Nothing outstanding: no deadline, however long the wait.
    let idle = tokio::time::timeout(Duration::from_secs(60), answers.next()).await;
    assert!(idle.is_err(), "an idle exchange must not time out");
    outstanding.push(10);
    tx.unbounded_send(ok_frame(1)).unwrap();
    assert!(answers.next().await.unwrap().is_ok());
    // A request the peer never answers.
    outstanding.push(10);
    let started = Instant::now();
    let answer = answers.next().await.unwrap();
    assert!(matches!(answer, Err(RPCError::Timeout(_))), "{answer:?}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        answers.next().await.is_none(),
        "the stream ends after the timeout"
    );
    drop(tx);
}

#[tokio::test]
async fn a_request_goes_in_parts_that_end_at_each_raise_of_the_cluster_version() {
    use meta_consensus::Command;
    let raise_at = |mut rpc: AppendEntriesRequest<TypeConfig>, at: usize| {
        rpc.entries[at].payload = openraft::EntryPayload::Normal(Command::SetClusterVersion {
            version: meta_consensus::BUILD_VERSION,
        });
        rpc
    };
    let span = |rpc: &AppendEntriesRequest<TypeConfig>| {
        let indexes = rpc.entries.iter().map(|e| e.log_id.index);
        (
            rpc.prev_log_id.map(|p| p.index),
            indexes.collect::<Vec<_>>(),
        )
    };
    let outstanding = Arc::new(Outstanding::default());
    // Entries 1-3 with a raise at 2; then "commit 5" held for entries 6-8 (a raise at 7).
    let input = futures::stream::iter(vec![
        raise_at(request(0, 3, 0), 1),
        request(5, 0, 5),
        raise_at(request(5, 3, 5), 1),
    ]);
    let mut body = Box::pin(requests(input, outstanding.clone(), 4));
    let mut frames = Vec::new();
    for _ in 0..4 {
        frames.push(span(&decoded(&body.next().await.unwrap().unwrap())));
    }
    assert_eq!(
        frames,
        [
            (Some(0), vec![1, 2]),
            (Some(2), vec![3]),
            (Some(5), vec![6, 7]),
            (Some(7), vec![8]),
        ],
        "each request cut after its raise, the held one stood in for"
    );
    // openraft hears one answer per request it made: the last part's.
    let answers = vec![ok_frame(2), ok_frame(3), ok_frame(7), ok_frame(8)];
    let matched = matched_indexes(answers, outstanding.clone()).await;
    assert_eq!(matched, vec![3, 5, 8]);
    assert_eq!(outstanding.len(), 0);
    let end = tokio::time::timeout(Duration::from_secs(10), body.next()).await;
    assert!(matches!(end, Ok(None)), "nothing else is sent");
}

#[tokio::test]
async fn a_refusal_of_a_leading_part_answers_its_request() {
    use meta_consensus::Command;
    let mut rpc = request(4, 2, 4);
    rpc.entries[0].payload =
        openraft::EntryPayload::Normal(Command::SetClusterVersion { version: 4 });
    let outstanding = Arc::new(Outstanding::default());
    let mut body = Box::pin(requests(
        futures::stream::iter(vec![rpc]),
        outstanding.clone(),
        4,
    ));
    for _ in 0..2 {
        body.next().await.unwrap().unwrap();
    }
    let conflict: RemoteResult<StreamAppendResult<TypeConfig>> =
        Ok(Err(openraft::raft::StreamAppendError::Conflict(log_id(4))));
    let got = all_answers(vec![answer_frame(&conflict), ok_frame(6)], outstanding).await;
    assert!(
        matches!(&got[..], [Ok(Err(openraft::raft::StreamAppendError::Conflict(p)))] if p.index == 4),
        "{got:?}"
    );
}
