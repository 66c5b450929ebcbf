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
//! An entry-less request (a new commit index and nothing else) waits up to `HOLD_ENTRYLESS`
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
use meta_consensus::{codec, split_after_version_raise, LogId, TypeConfig};
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
    /// The frame carries the first part of a request cut at a raise of the cluster's version
    /// (see [`parts`]): its success answers nothing (the next part's answer answers the
    /// request), its refusal answers the request.
    leads: bool,
}

impl Outstanding {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Sent>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a request of `bytes` leaving now.
    pub fn push(&self, bytes: usize) {
        self.push_sent(bytes, None, false);
    }

    fn push_sent(&self, bytes: usize, stands_in_for: Option<Option<LogId>>, leads: bool) {
        self.queue().push_back(Sent {
            at: Instant::now(),
            bytes,
            stands_in_for,
            leads,
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
        let mut parts = parts(rpc).into_iter().peekable();
        let mut going = true;
        while let (true, Some(part)) = (going, parts.next()) {
            let last = parts.peek().is_none();
            let frame = encode_frame(&part).map_err(std::io::Error::other);
            let encoded = frame.is_ok();
            if let Ok(f) = &frame {
                let stands_in_for = if last { stands_in_for } else { None };
                sent.push_sent(f.len(), stands_in_for, !last);
            }
            let queued = tokio::select! {
                queued = tx.send(frame) => queued.is_ok(),
                _ = sent.abandoned() => false,
            };
            going = queued && encoded;
        }
        if !going {
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

/// `rpc` as the frames that carry it: itself, or its parts cut after each raise of the cluster's
/// version (`split_after_version_raise`), each part after the first starting where the one before
/// ended. A member of an older build decodes a frame whole, and must be able to decode a raise
/// to stop at it; the frame after it, which it cannot decode, fails the exchange. Every part
/// goes at once, and only the last one's answer (or the first refusal) answers openraft: a
/// request that openraft sees partly answered it takes as in flight still, and sends nothing
/// after it until it has new entries to send.
fn parts(mut rpc: AppendEntriesRequest<TypeConfig>) -> Vec<AppendEntriesRequest<TypeConfig>> {
    let mut parts = Vec::new();
    while let Some(rest) = split_after_version_raise(&mut rpc.entries) {
        let next = AppendEntriesRequest {
            vote: rpc.vote,
            prev_log_id: rpc.entries.last().map(|e| e.log_id),
            leader_commit: rpc.leader_commit,
            entries: rest,
        };
        parts.push(std::mem::replace(&mut rpc, next));
    }
    parts.push(rpc);
    parts
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
            if popped.leads && answer.is_ok() {
                // The next part's answer answers the request.
                continue;
            }
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
mod tests;
