//! Reading a request body whole, bounded in size and in time, so that no client can hold a
//! connection slot, or memory, by sending a body slowly or without end. The admin API's
//! forwarding layer reads every `/v1` body this way (`forward.rs`); the `/raft` routes that take
//! one message each read theirs through [`bounded_raft_body`], each with a limit for its message.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// How long a whole body may take to arrive, before the allowance for its size.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A body's allowance for its size: one more second per this many bytes (1 MiB/s, far below a
/// member's link), so a large AppendEntries is not cut while a trickle is.
const BYTES_PER_SECOND: u64 = 1 << 20;

/// Reads `body` whole: 413 `body_too_large` if `headers` declare more than `limit` bytes (before
/// reading any) or more arrive, 408 `body_timeout` if it takes longer than `timeout` (plus
/// a second per MiB declared, when `sized`), 400 if the stream fails.
pub async fn read_bounded(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
    sized: bool,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        ApiError::too_large(
            "body_too_large",
            format!("request body is larger than {limit} bytes"),
        )
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let allowance = if sized {
        Duration::from_secs(declared.unwrap_or(limit as u64) / BYTES_PER_SECOND)
    } else {
        Duration::ZERO
    };
    let deadline = timeout + allowance;
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(ApiError::BodyTimeout(format!(
            "the request body did not arrive within {} s",
            deadline.as_secs_f64()
        ))),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                Err(too_large())
            } else {
                Err(ApiError::invalid(
                    "bad_body",
                    format!("could not read the request body: {e}"),
                ))
            }
        }
    }
}

/// Route layer of a `/raft` route that takes one message: reads the body with
/// [`read_bounded`] at the route's limit (the layer's state) before the handler runs.
pub async fn bounded_raft_body(
    State(limit): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    match read_bounded(&parts.headers, body, limit, BODY_TIMEOUT, true).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(e) => {
            let mut response = e.into_response();
            // The rest of a refused body is not read: the connection cannot carry another
            // request.
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
                tracing::debug!("refused an oversized Raft message");
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn headers(length: Option<u64>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(n) = length {
            h.insert(header::CONTENT_LENGTH, n.into());
        }
        h
    }

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_bounds() {
        let got = read_bounded(&headers(Some(3)), Body::from("abc"), 3, BODY_TIMEOUT, true)
            .await
            .unwrap();
        assert_eq!(&got[..], b"abc");
    }

    #[tokio::test]
    async fn a_body_past_its_limit_is_refused() {
        // Declared: refused before anything is read (the body never ends).
        let endless =
            Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        let e = read_bounded(&headers(Some(4)), endless, 3, BODY_TIMEOUT, true)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "body_too_large");
        // Undeclared: refused once more than the limit arrived.
        let e = read_bounded(&headers(None), Body::from("abcd"), 3, BODY_TIMEOUT, true)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "body_too_large");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_is_refused_after_its_deadline() {
        let stalled = Body::from_stream(
            futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"a"))])
                .chain(futures::stream::pending()),
        );
        let started = tokio::time::Instant::now();
        let e = read_bounded(&headers(Some(2)), stalled, 1 << 30, BODY_TIMEOUT, true)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "body_timeout");
        assert_eq!(started.elapsed(), BODY_TIMEOUT);
    }
}
