//! A budget for the bytes of large JSON answers that clients have yet to read. A listing page
//! can be megabytes (10,000 keys of 1 KiB), built whole in memory, and held until its client
//! reads it: a few hundred clients that ask and do not read (slow, stalled or hostile) held
//! gigabytes, bounded only by the connection slots. Each answer of at least [`LARGE`] bytes
//! takes its size from the budget until its body was handed to the connection whole; one that
//! does not fit is answered 503 `overloaded` instead (the client asks again later). Small
//! answers, and streamed ones (snapshot downloads, paced by the snapshot rate), pass as they
//! are.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::Body as HttpBody;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Answers at least this long take from the budget.
pub const LARGE: usize = 64 << 10;

/// The budget is counted in units of this many bytes.
const UNIT: usize = 1 << 10;

/// A budgeted answer is handed to the connection this much at a time, so that its budget
/// is given back only once the connection took (nearly) all of it.
const CHUNK: usize = 64 << 10;

/// The default budget: 256 MiB of large answers waiting to be read.
pub const DEFAULT_BUDGET_BYTES: usize = 256 << 20;

/// The bytes of large answers that may wait to be read at once.
#[derive(Debug, Clone)]
pub struct AnswerBudget {
    units: Arc<Semaphore>,
    bytes: usize,
}

impl AnswerBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        AnswerBudget {
            units: Arc::new(Semaphore::new((bytes / UNIT).max(1))),
            bytes,
        }
    }

    /// The bytes of the budget not taken now.
    pub fn available_bytes(&self) -> usize {
        self.units.available_permits() * UNIT
    }

    /// Takes `len` bytes from the budget, if they fit.
    fn take(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        let units = u32::try_from(len.div_ceil(UNIT)).ok()?;
        self.units.clone().try_acquire_many_owned(units).ok()
    }
}

impl Default for AnswerBudget {
    fn default() -> Self {
        AnswerBudget::new(DEFAULT_BUDGET_BYTES)
    }
}

/// Middleware: a JSON answer of at least [`LARGE`] bytes holds its size of `budget` until its
/// body was handed over whole, or is refused with 503 `overloaded` when the budget is spent.
pub async fn limit(State(budget): State<AnswerBudget>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let Some(len) = response.body().size_hint().exact() else {
        return response;
    };
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if !json || len < LARGE {
        return response;
    }
    let Some(permit) = budget.take(len) else {
        return ApiError::Overloaded(format!(
            "large answers waiting to be read already hold this node's budget for them ({} \
             MiB): ask again shortly, or for smaller pages (?limit=)",
            budget.bytes >> 20
        ))
        .into_response();
    };
    let (parts, body) = response.into_parts();
    match axum::body::to_bytes(body, len).await {
        Ok(bytes) => Response::from_parts(
            parts,
            Body::new(Budgeted {
                bytes,
                permit: Some(permit),
            }),
        ),
        Err(e) => ApiError::Internal(format!("reading an answer: {e}")).into_response(),
    }
}

/// An answer's bytes, handed over [`CHUNK`] at a time, holding its budget until the last.
struct Budgeted {
    bytes: Bytes,
    permit: Option<OwnedSemaphorePermit>,
}

impl HttpBody for Budgeted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.bytes.is_empty() {
            this.permit.take();
            return Poll::Ready(None);
        }
        let chunk = this.bytes.split_to(CHUNK.min(this.bytes.len()));
        if this.bytes.is_empty() {
            this.permit.take();
        }
        Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.bytes.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_large_answer_holds_its_size_until_its_last_chunk_is_taken() {
        let budget = AnswerBudget::new(256 << 10);
        let len = 200 << 10;
        let permit = budget.take(len).expect("fits");
        assert_eq!(budget.available_bytes(), 56 << 10);
        assert!(budget.take(len).is_none(), "a second does not fit");
        let mut body = Budgeted {
            bytes: Bytes::from(vec![7u8; len]),
            permit: Some(permit),
        };
        assert_eq!(body.size_hint().exact(), Some(len as u64));
        let mut got = 0;
        while let Some(frame) = body.frame().await {
            let chunk = frame.unwrap().into_data().unwrap();
            assert!(chunk.len() <= CHUNK);
            got += chunk.len();
            if got < len {
                assert_eq!(
                    budget.available_bytes(),
                    56 << 10,
                    "held until the last chunk"
                );
            }
        }
        assert_eq!(got, len);
        assert_eq!(budget.available_bytes(), 256 << 10, "given back");
    }

    #[tokio::test]
    async fn an_answer_dropped_unread_gives_its_budget_back() {
        let budget = AnswerBudget::new(128 << 10);
        let body = Budgeted {
            bytes: Bytes::from(vec![0u8; 100 << 10]),
            permit: budget.take(100 << 10),
        };
        assert_eq!(budget.available_bytes(), 28 << 10);
        drop(body);
        assert_eq!(budget.available_bytes(), 128 << 10);
    }
}
