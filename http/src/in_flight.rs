//! The requests a server is answering, counted from the handler's call until its response body
//! is done (or dropped), so that a graceful shutdown knows when only connections that answer
//! nothing are left: idle ones, and ones whose client has not finished sending a request's
//! headers (hyper's graceful shutdown waits for those until its header-read timeout).

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Body as HttpBody;
use tokio::sync::Notify;

/// The count of requests being answered.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    none: Notify,
}

/// One request being answered; dropping it ends it.
#[derive(Debug)]
pub struct Answering(Arc<InFlight>);

impl InFlight {
    /// Counts a request until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Answering {
        self.count.fetch_add(1, Ordering::AcqRel);
        Answering(self.clone())
    }

    /// The requests being answered now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Resolves once no request is being answered.
    pub async fn until_none(&self) {
        loop {
            let none = self.none.notified();
            if self.count() == 0 {
                return;
            }
            none.await;
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

/// Middleware: counts the request in `in_flight` until its response body is done.
pub async fn track(
    State(in_flight): State<Arc<InFlight>>,
    request: Request,
    next: Next,
) -> Response {
    let answering = in_flight.begin();
    next.run(request).await.map(|body| {
        Body::new(Counted {
            body,
            answering: Some(answering),
        })
    })
}

/// A response body that ends its request's count once it has no more to give.
struct Counted {
    body: Body,
    answering: Option<Answering>,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.answering.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_request_counts_until_its_body_is_done() {
        let in_flight = Arc::new(InFlight::default());
        assert!(in_flight.until_none().now_or_never().is_some(), "none yet");
        let first = in_flight.begin();
        let second = in_flight.begin();
        assert_eq!(in_flight.count(), 2);
        let waiting = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.until_none().await }
        });
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one still runs");
        drop(second);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("none left")
            .unwrap();

        let mut body = Counted {
            body: Body::from("answer"),
            answering: Some(in_flight.begin()),
        };
        assert_eq!(body.size_hint().exact(), Some(6), "the length goes along");
        assert_eq!(in_flight.count(), 1);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "answer");
        assert!(body.frame().await.is_none());
        assert_eq!(in_flight.count(), 0, "done once the body ended");
        let dropped = Counted {
            body: Body::from("never read"),
            answering: Some(in_flight.begin()),
        };
        drop(dropped);
        assert_eq!(in_flight.count(), 0, "done when dropped unread");
    }
}
