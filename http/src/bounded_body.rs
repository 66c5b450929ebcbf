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

/// How much of a refused body is read and dropped before the answer, and for how long at most:
/// a connection closed with bytes of the request unread is reset, and a reset can overtake the
/// answer, so that the client saw "connection reset" rather than 413 (a quarter of the time
/// for bodies a little over the limit). A body larger still is cut off as before.
const DRAIN_BYTES: u64 = 16 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Reads and drops what is left of `body`, up to [`DRAIN_BYTES`] and for [`DRAIN_TIME`] at
/// most.
async fn drain(mut body: Body) {
    use http_body_util::BodyExt;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut read = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len() as u64);
            if read > DRAIN_BYTES {
                return;
            }
        }
    })
    .await;
}

/// Reads `body` whole: 413 `body_too_large` if `headers` declare more than `limit` bytes (before
/// reading any of it for the request; one that can be read to its end within a second is,
/// and dropped) or more arrive (the rest is dropped likewise), 408 `body_timeout` if it takes
/// longer than `timeout` (plus a second per MiB declared, when `sized`), 400 if the stream
/// fails.
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
    if let Some(n) = declared.filter(|n| *n > limit as u64) {
        if n <= limit as u64 + DRAIN_BYTES {
            drain(body).await;
        }
        return Err(too_large());
    }
    let allowance = if sized {
        Duration::from_secs(declared.unwrap_or(limit as u64) / BYTES_PER_SECOND)
    } else {
        Duration::ZERO
    };
    let deadline = timeout + allowance;
    match tokio::time::timeout(deadline, read_up_to(body, limit)).await {
        Err(_) => Err(ApiError::BodyTimeout(format!(
            "the request body did not arrive within {} s",
            deadline.as_secs_f64()
        ))),
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(Cut::Over(rest))) => {
            drain(rest).await;
            Err(too_large())
        }
        Ok(Err(Cut::Failed(e))) => Err(ApiError::invalid(
            "bad_body",
            format!("could not read the request body: {e}"),
        )),
    }
}

/// Why [`read_up_to`] stopped short.
enum Cut {
    /// More than the limit arrived; what is left of the body.
    Over(Body),
    /// The stream failed.
    Failed(axum::Error),
}

/// `body` whole if it holds at most `limit` bytes.
async fn read_up_to(mut body: Body, limit: usize) -> Result<Bytes, Cut> {
    use http_body_util::BodyExt;
    let mut bytes = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(Cut::Failed)?.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            return Err(Cut::Over(body));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes.freeze())
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
