//! Calls into openraft that run to their end even when their caller stops waiting.
//!
//! openraft 0.10.0-alpha.37 records why its core stopped in a step that the first call to find
//! the core stopped runs for every caller; a caller cancelled in that step (a timeout, a dropped
//! request) left the record half made, and every later call panicked ("RaftCore should have
//! already quit"), the shutdown included (`tests/core_stop.rs`). Wrapped here, a call is polled
//! in place as usual (no task, no extra wake-up on the hot path); dropped before it finished, it
//! moves to a task of its own and finishes there.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

/// A future that finishes on a task of its own if it is dropped unfinished. See the module.
pub(crate) struct Uncancelled<F>(Option<Pin<Box<F>>>)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static;

/// Wraps `call` so that dropping it unfinished does not cancel it.
pub(crate) fn uncancelled<F>(call: F) -> Uncancelled<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Uncancelled(Some(Box::pin(call)))
}

impl<F> Future for Uncancelled<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Out while it is polled: a call that panics is dropped, not finished on a task.
        let Some(mut call) = self.0.take() else {
            panic!("an uncancelled call was polled after it finished");
        };
        let out = call.as_mut().poll(cx);
        if out.is_pending() {
            self.0 = Some(call);
        }
        out
    }
}

impl<F> Drop for Uncancelled<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(call) = self.0.take() {
            // Outside a runtime (it is gone) there is nothing left to finish the call on.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(call);
            }
        }
    }
}

/// A stream that, dropped before its end, is drained to its end on a task of its own.
pub(crate) struct UncancelledStream<S>(Option<Pin<Box<S>>>)
where
    S: Stream + Send + 'static,
    S::Item: Send;

/// Wraps `stream` so that dropping it early does not cancel the item being made.
pub(crate) fn uncancelled_stream<S>(stream: S) -> UncancelledStream<S>
where
    S: Stream + Send + 'static,
    S::Item: Send,
{
    UncancelledStream(Some(Box::pin(stream)))
}

impl<S> Stream for UncancelledStream<S>
where
    S: Stream + Send + 'static,
    S::Item: Send,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        // Out while it is polled: a stream that panics is dropped, not drained on a task.
        let Some(mut stream) = self.0.take() else {
            return Poll::Ready(None);
        };
        let next = stream.as_mut().poll_next(cx);
        if !matches!(next, Poll::Ready(None)) {
            self.0 = Some(stream);
        }
        next
    }
}

impl<S> Drop for UncancelledStream<S>
where
    S: Stream + Send + 'static,
    S::Item: Send,
{
    fn drop(&mut self) {
        use futures::StreamExt as _;
        if let Some(mut stream) = self.0.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { while stream.next().await.is_some() {} });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_dropped_unfinished_finishes_on_its_own_task() {
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let call = uncancelled(async move {
            let _ = go_rx.await;
            let _ = done_tx.send(());
        });
        // Polled once (it waits), then its caller gives up.
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(1), call).await;
        assert!(gave_up.is_err());
        go_tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), done_rx)
            .await
            .expect("the dropped call finished")
            .unwrap();
    }

    #[tokio::test]
    async fn a_call_polled_to_its_end_answers_in_place() {
        assert_eq!(uncancelled(async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn a_stream_dropped_early_is_drained_to_its_end() {
        use futures::StreamExt as _;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let source = futures::stream::unfold((rx, Some(done_tx)), |(mut rx, done)| async move {
            match rx.recv().await {
                Some(v) => Some((v, (rx, done))),
                None => {
                    let _ = done.map(|d| d.send(()));
                    None
                }
            }
        });
        let mut stream = uncancelled_stream(source);
        tx.send(1).unwrap();
        assert_eq!(stream.next().await, Some(1));
        drop(stream);
        tx.send(2).unwrap();
        drop(tx);
        tokio::time::timeout(std::time::Duration::from_secs(10), done_rx)
            .await
            .expect("the dropped stream was drained")
            .unwrap();
    }
}
