//! Forwarded writes travel to the leader in batches: one HTTP exchange carries every write that
//! queued at a follower while its previous batches were in flight.
//!
//! A follower under load forwards many small writes at once (every datanode of a restart storm
//! that happens to be connected to it). Sent one exchange each, every write costs the leader
//! an HTTP request to parse and answer and costs both nodes their TCP round trip; batched, the
//! leader answers them all in one exchange, running each through its own admin routes exactly
//! as if it had arrived alone (marked forwarded, so a leader that lost its office answers 503
//! `no_leader` instead of forwarding again). Batching is group commit: a write waits only while
//! [`MAX_IN_FLIGHT`] batches are out (and at most [`SLOT_WAIT`], so a batch stuck at a leader
//! that stopped answering does not hold back the writes behind it), and a lone write leaves
//! at once.
//!
//! Only writes are batched: their answers are small. Linearizable reads, whose answers may be
//! long listings, are still replayed one exchange each and streamed back (`forward.rs`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use meta_consensus::codec;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tower::ServiceExt;

use crate::auth::Token;
use crate::error::{ApiError, ForwardTo};
use crate::forward::{leader_failed, FORWARDED_BY, RELAYED};

/// The leader's route for batches of forwarded writes.
pub const PATH_FORWARD_BATCH: &str = "/raft/forward-batch";

/// Batches one follower may have out at once; further writes queue and go in the next batch.
const MAX_IN_FLIGHT: usize = 2;
/// Longest a batch waits for one of the [`MAX_IN_FLIGHT`] slots; then it goes anyway.
const SLOT_WAIT: Duration = Duration::from_millis(20);
/// Most writes in one batch.
const MAX_BATCH: usize = 256;
/// A batch stops growing at this many body bytes (a larger write still goes, alone).
const MAX_BATCH_BYTES: usize = 4 << 20;
/// Largest answer the leader returns for one write of a batch.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// One forwarded write, as it travels in a batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// The leader's answer to one write of a batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireAnswer {
    pub status: u16,
    /// The relayed headers (content type, retry-after, revision).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl WireAnswer {
    fn into_response(self) -> Response {
        let mut response = Response::builder().status(self.status);
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                response = response.header(name, value);
            }
        }
        response
            .body(Body::from(self.body))
            .unwrap_or_else(|e| ApiError::Internal(e.to_string()).into_response())
    }
}

struct Queued {
    target: ForwardTo,
    request: WireRequest,
    answer: oneshot::Sender<Response>,
}

/// A follower's queue of writes for the leader. Cloning shares the queue; the task that
/// drains it ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Batcher {
    link: Arc<Link>,
    queue: Arc<OnceLock<mpsc::UnboundedSender<Queued>>>,
}

/// What sending a batch needs (and all the queue's task holds).
#[derive(Debug)]
struct Link {
    id: u64,
    client: reqwest::Client,
    token: Token,
    timeout: Duration,
}

impl Batcher {
    /// The batcher of node `id`, sending with `client` and this node's `token`; a batch must
    /// be answered within `timeout`.
    pub fn new(id: u64, client: reqwest::Client, token: Token, timeout: Duration) -> Self {
        Batcher {
            link: Arc::new(Link {
                id,
                client,
                token,
                timeout,
            }),
            queue: Arc::default(),
        }
    }

    /// Sends `request` to the leader `target` in the next batch and returns its answer. The
    /// queue's task starts with the first write (on the caller's runtime).
    pub async fn send(&self, target: ForwardTo, request: WireRequest) -> Response {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(self.link.clone().run(rx));
            tx
        });
        let (answer, answered) = oneshot::channel();
        let queued = Queued {
            target,
            request,
            answer,
        };
        if queue.send(queued).is_err() {
            return ApiError::Unavailable("the forwarding queue is closed".into()).into_response();
        }
        answered.await.unwrap_or_else(|_| {
            ApiError::Internal("a forwarded write lost its answer".into()).into_response()
        })
    }
}

impl Link {
    /// Drains the queue into batches, at most [`MAX_IN_FLIGHT`] out at a time.
    async fn run(self: Arc<Self>, mut queue: mpsc::UnboundedReceiver<Queued>) {
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        while let Some(first) = queue.recv().await {
            // A batch stuck at a leader that stopped answering holds its slot until it times
            // out; writes behind it (perhaps for a new leader) wait for a slot only so long.
            let slot = tokio::time::timeout(SLOT_WAIT, slots.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok);
            let mut bytes = first.request.body.len();
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                match queue.try_recv() {
                    Ok(q) => {
                        bytes += q.request.body.len();
                        batch.push(q);
                    }
                    Err(_) => break,
                }
            }
            let this = self.clone();
            tokio::spawn(async move {
                this.send_batches(batch).await;
                drop(slot);
            });
        }
    }

    /// Sends `batch`, one exchange per leader it names (one, unless the leader just changed).
    async fn send_batches(&self, mut batch: Vec<Queued>) {
        while let Some(first) = batch.first() {
            let addr = first.target.addr.clone();
            let (same, rest): (Vec<_>, Vec<_>) =
                batch.into_iter().partition(|q| q.target.addr == addr);
            batch = rest;
            self.send_one_batch(same).await;
        }
    }

    async fn send_one_batch(&self, batch: Vec<Queued>) {
        let target = batch[0].target.clone();
        let requests: Vec<&WireRequest> = batch.iter().map(|q| &q.request).collect();
        let answers = self.exchange(&target, &requests).await;
        match answers {
            Ok(answers) => {
                for (q, a) in batch.into_iter().zip(answers) {
                    let _ = q.answer.send(a.into_response());
                }
            }
            Err(e) => {
                for q in batch {
                    let _ = q.answer.send(e.clone().into_response());
                }
            }
        }
    }

    async fn exchange(
        &self,
        target: &ForwardTo,
        requests: &[&WireRequest],
    ) -> Result<Vec<WireAnswer>, ApiError> {
        let leader = |what: String| {
            format!(
                "the leader (node {} at {}) {what}",
                target.leader_id, target.addr
            )
        };
        let body = codec::encode(requests)
            .map_err(|e| ApiError::Internal(format!("encoding a forwarded batch: {e}")))?;
        let mut request = self
            .client
            .post(format!("http://{}{PATH_FORWARD_BATCH}", target.addr))
            .timeout(self.timeout)
            .header(FORWARDED_BY, self.id)
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        if let Some(value) = self.token.header_value() {
            request = request.header(header::AUTHORIZATION, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| leader_failed(target, &e))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| ApiError::NoLeader(leader(format!("broke off its answer: {e}"))))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
            return Err(ApiError::NoLeader(leader(format!(
                "refused a batch ({status}): {text}"
            ))));
        }
        let answers: Vec<WireAnswer> = codec::decode(&bytes).map_err(|e| {
            ApiError::Internal(leader(format!("answered an undecodable batch: {e}")))
        })?;
        if answers.len() != requests.len() {
            return Err(ApiError::Internal(leader(format!(
                "answered {} of {} forwarded writes",
                answers.len(),
                requests.len()
            ))));
        }
        Ok(answers)
    }
}

/// The leader's end: runs every write of the batch through `routes` (the admin routes, without
/// forwarding), all at once, marked as forwarded by node `from` (this one), and answers each,
/// in order.
pub async fn serve(routes: Router, from: u64, body: Bytes) -> Response {
    let requests: Vec<WireRequest> = match codec::decode(&body) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::invalid("bad_batch", format!("undecodable forwarded batch: {e}"))
                .into_response()
        }
    };
    let answers = futures::future::join_all(
        requests
            .into_iter()
            .map(|r| answer_one(routes.clone(), r, from)),
    )
    .await;
    match codec::encode(&answers) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => ApiError::Internal(format!("encoding a batch's answers: {e}")).into_response(),
    }
}

async fn answer_one(routes: Router, r: WireRequest, from: u64) -> WireAnswer {
    let refused = |status: StatusCode, e: String| WireAnswer {
        status: status.as_u16(),
        headers: vec![(
            header::CONTENT_TYPE.to_string(),
            b"application/json".to_vec(),
        )],
        body: serde_json::json!({"error": {"code": "bad_batch", "message": e}})
            .to_string()
            .into_bytes(),
    };
    let Ok(method) = Method::from_bytes(r.method.as_bytes()) else {
        return refused(StatusCode::BAD_REQUEST, format!("method {:?}", r.method));
    };
    let mut request = Request::builder()
        .method(method)
        .uri(&r.path)
        .header(FORWARDED_BY, from);
    if let Some(ct) = &r.content_type {
        request = request.header(header::CONTENT_TYPE, ct);
    }
    let request = match request.body(Body::from(r.body)) {
        Ok(request) => request,
        Err(e) => return refused(StatusCode::BAD_REQUEST, format!("request {}: {e}", r.path)),
    };
    let response = match routes.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let status = response.status().as_u16();
    let headers = RELAYED
        .iter()
        .filter_map(|name| {
            response
                .headers()
                .get(name)
                .map(|v| (name.to_string(), v.as_bytes().to_vec()))
        })
        .collect();
    match axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
        Ok(body) => WireAnswer {
            status,
            headers,
            body: body.to_vec(),
        },
        Err(e) => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer to {} could not be read: {e}", r.path),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use futures::FutureExt;

    /// A stand-in leader that reports each batch's bodies, holds its answer until released,
    /// then answers every write with its own body.
    async fn fake_leader() -> (
        String,
        mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
        Arc<Semaphore>,
    ) {
        let (seen_tx, seen_rx) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let gate = release.clone();
        let app = Router::new().route(
            PATH_FORWARD_BATCH,
            post(move |body: Bytes| {
                let seen = seen_tx.clone();
                let gate = gate.clone();
                async move {
                    let requests: Vec<WireRequest> = codec::decode(&body).unwrap();
                    let bodies: Vec<Vec<u8>> = requests.iter().map(|r| r.body.clone()).collect();
                    seen.send(bodies.clone()).unwrap();
                    gate.acquire().await.unwrap().forget();
                    let answers: Vec<WireAnswer> = bodies
                        .into_iter()
                        .map(|body| WireAnswer {
                            status: 200,
                            headers: vec![("x-revision".into(), b"7".to_vec())],
                            body,
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

    fn write(body: &str) -> WireRequest {
        WireRequest {
            method: "POST".into(),
            path: "/v1/datanodes/1/shards".into(),
            content_type: Some("application/json".into()),
            body: body.as_bytes().to_vec(),
        }
    }

    async fn body_of(response: Response) -> (u16, String) {
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn writes_queued_behind_busy_batches_go_together_and_get_their_own_answers() {
        let (addr, mut seen, release) = fake_leader().await;
        let target = ForwardTo { leader_id: 1, addr };
        let b = Batcher::new(
            2,
            crate::network::peer_client(),
            Token::new(None),
            Duration::from_secs(30),
        );
        let mut first = Box::pin(b.send(target.clone(), write("w0")));
        assert!((&mut first).now_or_never().is_none());
        // The first write leaves alone; with one more batch allowed out, the next write leaves
        // at once too, and takes the writes queued behind it.
        assert_eq!(seen.recv().await.unwrap(), vec![b"w0".to_vec()]);
        let mut rest: Vec<_> = (1..5)
            .map(|i| Box::pin(b.send(target.clone(), write(&format!("w{i}")))))
            .collect();
        for f in &mut rest {
            assert!(f.now_or_never().is_none(), "queued, not answered");
        }
        let second = seen.recv().await.unwrap();
        assert_eq!(
            second,
            (1..5)
                .map(|i| format!("w{i}").into_bytes())
                .collect::<Vec<_>>()
        );
        release.add_permits(2);
        let (status, body) = body_of(first.await).await;
        assert_eq!((status, body.as_str()), (200, "w0"));
        for (i, f) in rest.into_iter().enumerate() {
            let response = f.await;
            assert_eq!(response.headers()["x-revision"], "7");
            let (status, body) = body_of(response).await;
            assert_eq!((status, body), (200, format!("w{}", i + 1)));
        }
    }

    #[tokio::test]
    async fn batches_stuck_at_a_silent_leader_do_not_hold_back_writes_for_another() {
        let (silent, mut seen, _never) = fake_leader().await;
        let (live, _seen_live, release) = fake_leader().await;
        release.add_permits(1);
        let b = Batcher::new(
            2,
            crate::network::peer_client(),
            Token::new(None),
            Duration::from_secs(300),
        );
        let to = |addr: &str| ForwardTo {
            leader_id: 1,
            addr: addr.to_string(),
        };
        // Both slots go to batches the silent leader never answers.
        let mut stuck: Vec<_> = (0..2)
            .map(|i| Box::pin(b.send(to(&silent), write(&format!("s{i}")))))
            .collect();
        for f in &mut stuck {
            assert!(f.now_or_never().is_none());
            seen.recv().await.unwrap();
        }
        let answer = tokio::time::timeout(Duration::from_secs(10), b.send(to(&live), write("w")))
            .await
            .expect("the write for the live leader is answered");
        assert_eq!(body_of(answer).await, (200, "w".to_string()));
    }

    #[tokio::test]
    async fn an_unreachable_leader_fails_every_write_of_the_batch_with_503() {
        // A port nobody listens on: bind, read the port, close.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let target = ForwardTo {
            leader_id: 1,
            addr: format!("127.0.0.1:{port}"),
        };
        let b = Batcher::new(
            2,
            crate::network::peer_client(),
            Token::new(None),
            Duration::from_secs(5),
        );
        let answers = futures::future::join_all(
            (0..3).map(|i| b.send(target.clone(), write(&format!("w{i}")))),
        )
        .await;
        for a in answers {
            let (status, body) = body_of(a).await;
            assert_eq!(status, 503, "{body}");
            assert!(
                body.contains("no_leader") && body.contains("unreachable"),
                "{body}"
            );
        }
    }
}
