//! The leader's end of a streamed AppendEntries exchange: which requests are still waiting
//! for their answer, and the stream of answers, each due within a deadline.
//!
//! openraft hands the transport a stream of requests for one replication session and expects
//! the answers in the same order. The requests go out as frames of one HTTP request body
//! while the answers come back as frames of its response (`raft_routes.rs` has the
//! follower's end), so the next entries leave without waiting for the previous answer. A
//! follower that stops answering is detected per request: the oldest unanswered request must
//! be answered within its deadline, counted from when it was sent or from the previous
//! answer, whichever is later.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use meta_consensus::{codec, TypeConfig};
use openraft::errors::{NetworkError, RPCError, Unreachable};
use openraft::raft::StreamAppendResult;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::raft_routes::RemoteResult;

/// Requests sent on one exchange and not yet answered: when each was sent and its size.
#[derive(Debug, Default)]
pub struct Outstanding {
    sent: Mutex<VecDeque<(Instant, usize)>>,
    pushed: Notify,
    answered: Notify,
}

impl Outstanding {
    fn queue(&self) -> MutexGuard<'_, VecDeque<(Instant, usize)>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a request of `bytes` leaving now.
    pub fn push(&self, bytes: usize) {
        self.queue().push_back((Instant::now(), bytes));
        self.pushed.notify_one();
    }

    fn pop(&self) -> bool {
        let popped = self.queue().pop_front().is_some();
        self.answered.notify_one();
        popped
    }

    /// Waits until fewer than `limit` requests are unanswered.
    pub async fn below(&self, limit: usize) {
        while self.len() >= limit {
            let answered = self.answered.notified();
            if self.len() < limit {
                return;
            }
            answered.await;
        }
    }

    fn oldest(&self) -> Option<(Instant, usize)> {
        self.queue().front().copied()
    }

    fn len(&self) -> usize {
        self.queue().len()
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

struct State<F> {
    frames: F,
    outstanding: Arc<Outstanding>,
    policy: AnswerPolicy,
    last_answer: Instant,
}

/// The answers read from `frames`, in order. Ends after the answer that is an error (openraft
/// ends the exchange there), when the response ends with nothing outstanding, or with one
/// error: the response failed or ended early, an answer did not decode or came for no request,
/// the peer reported a failure (`Unreachable`), or the oldest request was not answered in time.
pub fn answers<F>(
    frames: F,
    outstanding: Arc<Outstanding>,
    policy: AnswerPolicy,
) -> BoxStream<'static, Answer>
where
    F: Stream<Item = Result<Bytes, String>> + Send + Unpin + 'static,
{
    let state = State {
        frames,
        outstanding,
        policy,
        last_answer: Instant::now(),
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
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
                frames,
                outstanding,
                policy,
                last_answer,
            } = &mut st;
            tokio::select! {
                frame = frames.next() => {
                    let frame = match frame {
                        None if outstanding.len() == 0 => return None,
                        None => {
                            let m = format!("ended with {} requests unanswered", outstanding.len());
                            return Some((network(&policy.peer, m), None));
                        }
                        Some(Err(e)) => return Some((network(&policy.peer, e), None)),
                        Some(Ok(frame)) => frame,
                    };
                    let answer: RemoteResult<StreamAppendResult<TypeConfig>> =
                        match codec::decode(&frame) {
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
                    if !outstanding.pop() {
                        let m = "an answer for no request".to_string();
                        return Some((network(&policy.peer, m), None));
                    }
                    *last_answer = Instant::now();
                    let go_on = answer.is_ok();
                    return Some((Ok(answer), go_on.then_some(st)));
                }
                _ = outstanding.pushed.notified(), if due.is_none() => {}
                _ = tokio::time::sleep_until(due.map(|d| d.0).unwrap_or_else(Instant::now)),
                    if due.is_some() => {
                    let allowed = due.map(|d| d.1).unwrap_or_default();
                    return Some((Err((policy.timed_out)(allowed)), None));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn ok_frame(index: u64) -> Result<Bytes, String> {
        let log_id = LogId::new(
            openraft::impls::leader_id_adv::LeaderId {
                term: 1,
                node_id: 1,
            },
            index,
        );
        let answer: RemoteResult<StreamAppendResult<TypeConfig>> = Ok(Ok(Some(log_id)));
        Ok(codec::encode(&answer).unwrap().into())
    }

    #[test]
    fn the_window_opens_when_an_answer_comes() {
        use futures::FutureExt;
        let o = Outstanding::default();
        o.push(1);
        o.push(1);
        assert!(o.below(3).now_or_never().is_some());
        assert!(
            o.below(2).now_or_never().is_none(),
            "two of two are unanswered"
        );
        assert!(o.pop());
        assert!(o.below(2).now_or_never().is_some());
    }

    #[tokio::test]
    async fn answers_come_in_order_and_the_stream_ends_cleanly() {
        let outstanding = Arc::new(Outstanding::default());
        outstanding.push(10);
        outstanding.push(10);
        let frames = futures::stream::iter(vec![ok_frame(1), ok_frame(2)]);
        let got: Vec<_> = answers(frames, outstanding.clone(), policy(Duration::from_secs(5)))
            .collect()
            .await;
        let indexes: Vec<u64> = got
            .into_iter()
            .map(|a| a.unwrap().unwrap().unwrap().index)
            .collect();
        assert_eq!(indexes, vec![1, 2]);
        assert_eq!(outstanding.len(), 0);
    }

    #[tokio::test]
    async fn an_early_end_an_extra_answer_and_a_remote_failure_are_errors() {
        let outstanding = Arc::new(Outstanding::default());
        outstanding.push(10);
        outstanding.push(10);
        let got: Vec<_> = answers(
            futures::stream::iter(vec![ok_frame(1)]),
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
            futures::stream::iter(vec![ok_frame(1)]),
            Arc::new(Outstanding::default()),
            policy(Duration::from_secs(5)),
        )
        .collect()
        .await;
        assert!(matches!(&got[..], [Err(RPCError::Network(_))]), "{got:?}");

        let outstanding = Arc::new(Outstanding::default());
        outstanding.push(10);
        let failure: RemoteResult<StreamAppendResult<TypeConfig>> = Err("shutting down".into());
        let got: Vec<_> = answers(
            futures::stream::iter(vec![Ok(codec::encode(&failure).unwrap().into())]),
            outstanding,
            policy(Duration::from_secs(5)),
        )
        .collect()
        .await;
        assert!(
            matches!(&got[..], [Err(RPCError::Unreachable(_))]),
            "{got:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_only_while_a_request_waits() {
        let outstanding = Arc::new(Outstanding::default());
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, String>>();
        let mut answers = answers(rx, outstanding.clone(), policy(Duration::from_millis(200)));
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
