//! The leader's end of a streamed AppendEntries exchange: the request body, which requests
//! are still waiting for their answer, and the stream of answers, each due within a deadline.
//!
//! openraft hands the transport a stream of requests for one replication session and expects
//! the answers in the same order. The requests go out as frames of one HTTP request body
//! while the answers come back as frames of its response (`raft_routes.rs` has the
//! follower's end), so the next entries leave without waiting for the previous answer. A
//! follower that stops answering is detected per request: the oldest unanswered request must
//! be answered within its deadline, counted from when it was sent or from the previous
//! answer, whichever is later.
//!
//! An entry-less request (a new commit index and nothing else) waits up to [`HOLD_ENTRYLESS`]
//! for the next request: one at the same position goes in its place, carrying the same or a
//! newer commit index, and its answer answers both. At one client every entry was otherwise
//! followed by an entry-less round trip to each follower, half the replication messages.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use meta_consensus::{codec, LogId, TypeConfig};
use openraft::errors::{NetworkError, RPCError, Unreachable};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::frame::encode_frame;
use crate::raft_routes::RemoteResult;

/// How long an entry-less request waits for a request at the same position to stand in for it.
/// Followers learn a commit index at most this much later; at one client the next entry comes
/// well within it, and half of the replication messages go.
const HOLD_ENTRYLESS: Duration = Duration::from_millis(2);

/// Requests sent on one exchange and not yet answered: when each was sent, its size, and the
/// position of an entry-less request it stands in for (see [`requests`]).
///
/// The answers stream marks it abandoned when it is dropped (openraft ended the session, or an
/// error ended the stream): the request body then ends too, instead of waiting for answers
/// or entries that nobody will read.
#[derive(Debug, Default)]
pub struct Outstanding {
    sent: Mutex<VecDeque<Sent>>,
    pushed: Notify,
    answered: Notify,
    abandoned: AtomicBool,
    gone: Notify,
}

/// One frame sent and not yet answered.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    bytes: usize,
    /// Set when the frame also answers for an entry-less request that was never sent: that
    /// request's `prev_log_id`, which the frame's request shares.
    stands_in_for: Option<Option<LogId>>,
}

impl Outstanding {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Sent>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a request of `bytes` leaving now.
    pub fn push(&self, bytes: usize) {
        self.push_sent(bytes, None);
    }

    fn push_sent(&self, bytes: usize, stands_in_for: Option<Option<LogId>>) {
        self.queue().push_back(Sent {
            at: Instant::now(),
            bytes,
            stands_in_for,
        });
        self.pushed.notify_one();
    }

    fn pop(&self) -> Option<Sent> {
        let popped = self.queue().pop_front();
        self.answered.notify_one();
        popped
    }

    /// Waits until fewer than `limit` requests are unanswered; `false` if the answers were
    /// abandoned meanwhile.
    pub async fn below(&self, limit: usize) -> bool {
        loop {
            if self.is_abandoned() {
                return false;
            }
            if self.len() < limit {
                return true;
            }
            let answered = self.answered.notified();
            if self.len() < limit || self.is_abandoned() {
                continue;
            }
            answered.await;
        }
    }

    fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
        self.answered.notify_one();
        self.gone.notify_one();
    }

    fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }

    /// Resolves once the answers are abandoned.
    pub async fn abandoned(&self) {
        while !self.is_abandoned() {
            self.gone.notified().await;
        }
    }

    fn oldest(&self) -> Option<(Instant, usize)> {
        self.queue().front().map(|s| (s.at, s.bytes))
    }

    fn len(&self) -> usize {
        self.queue().len()
    }
}

/// The request body of an exchange: each request openraft yields, framed, with at most
/// `window` unanswered at a time. openraft builds each request when asked, from everything
/// submitted by then, so while the window is full new entries gather into the next request.
///
/// A task of its own pulls the requests from openraft, not the HTTP connection: openraft's
/// request stream holds the peer's replication state locked while it waits for new entries,
/// and a connection that stops polling its body (its peer stopped reading) would keep it
/// locked and block every later session to that peer. The task lets go of openraft's stream
/// as soon as the answers are abandoned, openraft's requests end, or the body is dropped.
pub fn requests<S>(
    input: S,
    outstanding: Arc<Outstanding>,
    window: usize,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(pull_requests(input, outstanding, window, tx));
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) })
}

async fn pull_requests<S>(
    mut input: S,
    sent: Arc<Outstanding>,
    window: usize,
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    // A request pulled while an entry-less one was held, that could not stand in for it.
    let mut carried: Option<AppendEntriesRequest<TypeConfig>> = None;
    let mut ended = false;
    while !ended || carried.is_some() {
        let open = tokio::select! {
            open = sent.below(window) => open,
            _ = tx.closed() => false,
        };
        if !open {
            break;
        }
        let rpc = match carried.take() {
            Some(rpc) => rpc,
            None => match next_request(&mut input, &sent, &tx).await {
                Some(rpc) => rpc,
                None => break,
            },
        };
        let (rpc, stands_in_for) = if rpc.entries.is_empty() {
            // An entry-less request (openraft telling the follower a new commit index) lets
            // the tasks woken with it run first: at one client they apply the entry and answer
            // the client, whose answer otherwise waits behind this send.
            tokio::task::yield_now().await;
            // Then it waits a little for the next request: one at the same position carries
            // the same or a newer commit index, and its answer answers for both.
            match tokio::time::timeout(HOLD_ENTRYLESS, next_request(&mut input, &sent, &tx)).await {
                Ok(Some(next)) if can_stand_in(&next, &rpc) => (next, Some(rpc.prev_log_id)),
                Ok(Some(next)) => {
                    carried = Some(next);
                    (rpc, None)
                }
                Ok(None) => {
                    ended = true;
                    (rpc, None)
                }
                Err(_) => (rpc, None),
            }
        } else {
            (rpc, None)
        };
        let frame = encode_frame(&rpc).map_err(std::io::Error::other);
        let encoded = frame.is_ok();
        if let Ok(f) = &frame {
            sent.push_sent(f.len(), stands_in_for);
        }
        let queued = tokio::select! {
            queued = tx.send(frame) => queued.is_ok(),
            _ = sent.abandoned() => false,
        };
        if !queued || !encoded {
            break;
        }
    }
    // openraft's stream first: that releases its lock before the body ends.
    drop(input);
    drop(tx);
}

/// The next request from openraft; `None` once its requests end, the answers are abandoned or
/// the body is dropped.
async fn next_request<S>(
    input: &mut S,
    sent: &Outstanding,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) -> Option<AppendEntriesRequest<TypeConfig>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    tokio::select! {
        rpc = input.next() => rpc,
        _ = sent.abandoned() => None,
        _ = tx.closed() => None,
    }
}

/// Whether `next` may go in place of the entry-less `held`, its answer answering for both: it
/// starts at the same position under the same vote, so a follower accepts or refuses both
/// alike. openraft builds requests in order, so its commit index is not older.
fn can_stand_in(
    next: &AppendEntriesRequest<TypeConfig>,
    held: &AppendEntriesRequest<TypeConfig>,
) -> bool {
    held.entries.is_empty()
        && next.prev_log_id == held.prev_log_id
        && next.vote == held.vote
        && next.leader_commit >= held.leader_commit
}

/// The answer to an entry-less request at `prev` that was never sent, derived from the answer
/// to the request that stood in for it: success means the follower's log matched at `prev`;
/// a refusal (conflict at `prev`, higher vote) is the same refusal.
fn answer_for_held(
    prev: Option<LogId>,
    answer: &StreamAppendResult<TypeConfig>,
) -> StreamAppendResult<TypeConfig> {
    match answer {
        Ok(_) => Ok(prev),
        Err(e) => Err(e.clone()),
    }
}

/// How the answers of one exchange are judged.
pub struct AnswerPolicy {
    /// Names the peer in error messages.
    pub peer: String,
    /// How long the answer to a request of this many bytes may take.
    pub deadline: Box<dyn Fn(usize) -> Duration + Send>,
    /// The error for an answer that did not come within `deadline`.
    pub timed_out: Box<dyn Fn(Duration) -> RPCError<TypeConfig> + Send>,
}

type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// The answer frames of an exchange whose response has arrived.
pub type Frames = BoxStream<'static, Result<Bytes, String>>;

/// The exchange until its response head arrives: then its answer frames, or why it failed.
pub type Connecting = BoxFuture<'static, Result<Frames, RPCError<TypeConfig>>>;

struct State {
    connecting: Option<Connecting>,
    frames: Option<Frames>,
    outstanding: Arc<Outstanding>,
    policy: AnswerPolicy,
    last_answer: Instant,
    /// The answer that follows the one just given (a frame that stood in for a held request
    /// answers twice).
    queued: Option<StreamAppendResult<TypeConfig>>,
}

impl Drop for State {
    fn drop(&mut self) {
        self.outstanding.abandon();
    }
}

/// The answers of an exchange, in order: `connecting` resolves when the response head arrives
/// (its deadlines are the requests', so an exchange that has sent nothing yet may wait for its
/// head as long as it has nothing to say), then answers are read from its frames. Ends after
/// the answer that is an error (openraft ends the exchange there), when the response ends with
/// nothing outstanding, or with one error: the exchange failed, the response failed or ended
/// early, an answer did not decode or came for no request, the peer reported a failure
/// (`Unreachable`), or the oldest request was not answered in time.
pub fn answers(
    connecting: Connecting,
    outstanding: Arc<Outstanding>,
    policy: AnswerPolicy,
) -> BoxStream<'static, Answer> {
    let state = State {
        connecting: Some(connecting),
        frames: None,
        outstanding,
        policy,
        last_answer: Instant::now(),
        queued: None,
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        if let Some(answer) = st.queued.take() {
            let go_on = answer.is_ok();
            return Some((Ok(answer), go_on.then_some(st)));
        }
        let network = |peer: &str, m: String| -> Answer {
            Err(RPCError::Network(NetworkError::from_string(format!(
                "append stream to {peer}: {m}"
            ))))
        };
        loop {
            let due = st.outstanding.oldest().map(|(sent, bytes)| {
                let allowed = (st.policy.deadline)(bytes);
                (sent.max(st.last_answer) + allowed, allowed)
            });
            let State {
                connecting,
                frames,
                outstanding,
                policy,
                last_answer,
                queued,
            } = &mut st;
            let next = async {
                match (connecting.as_mut(), frames.as_mut()) {
                    (Some(c), _) => Step::Connected(c.await),
                    (None, Some(f)) => Step::Frame(f.next().await),
                    (None, None) => Step::Frame(None),
                }
            };
            let step = tokio::select! {
                step = next => step,
                _ = outstanding.pushed.notified(), if due.is_none() => continue,
                _ = tokio::time::sleep_until(due.map(|d| d.0).unwrap_or_else(Instant::now)),
                    if due.is_some() => {
                    let allowed = due.map(|d| d.1).unwrap_or_default();
                    return Some((Err((policy.timed_out)(allowed)), None));
                }
            };
            let frame = match step {
                Step::Connected(Ok(f)) => {
                    *connecting = None;
                    *frames = Some(f);
                    continue;
                }
                Step::Connected(Err(e)) => return Some((Err(e), None)),
                Step::Frame(None) if outstanding.len() == 0 => return None,
                Step::Frame(None) => {
                    let m = format!("ended with {} requests unanswered", outstanding.len());
                    return Some((network(&policy.peer, m), None));
                }
                Step::Frame(Some(Err(e))) => return Some((network(&policy.peer, e), None)),
                Step::Frame(Some(Ok(frame))) => frame,
            };
            let answer: RemoteResult<StreamAppendResult<TypeConfig>> = match codec::decode(&frame) {
                Ok(a) => a,
                Err(e) => {
                    let m = format!("undecodable answer: {e}");
                    return Some((network(&policy.peer, m), None));
                }
            };
            let answer = match answer {
                Ok(a) => a,
                Err(m) => {
                    let e = Unreachable::from_string(format!("{}: {m}", policy.peer));
                    return Some((Err(RPCError::Unreachable(e)), None));
                }
            };
            let Some(popped) = outstanding.pop() else {
                let m = "an answer for no request".to_string();
                return Some((network(&policy.peer, m), None));
            };
            *last_answer = Instant::now();
            let answer = match popped.stands_in_for {
                Some(prev) => {
                    let first = answer_for_held(prev, &answer);
                    *queued = Some(answer);
                    first
                }
                None => answer,
            };
            let go_on = answer.is_ok();
            return Some((Ok(answer), go_on.then_some(st)));
        }
    })
    .boxed()
}

enum Step {
    Connected(Result<Frames, RPCError<TypeConfig>>),
    Frame(Option<Result<Bytes, String>>),
}

#[cfg(test)]
mod tests {
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
    fn answer_frame(
        answer: &RemoteResult<StreamAppendResult<TypeConfig>>,
    ) -> Result<Bytes, String> {
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
}
