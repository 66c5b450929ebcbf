//! Serving the router: one task per accepted connection, HTTP/1 with keep-alive, and a graceful
//! shutdown.
//!
//! A keep-alive connection that sends no request for the idle timeout is closed, as is one
//! that takes that long to send a request's headers: every open connection holds a slot of the
//! listener and a file descriptor, and a client that went away without closing (or one that
//! holds connections open on purpose) would otherwise hold them forever. The timer runs only
//! while the server waits for a request's headers (hyper's header-read timeout), never while a
//! request is being answered, so a long request (a snapshot build, a large listing) is not cut.
//! Accepted connections also get TCP keepalive, so a peer that vanished while its request was
//! answered is noticed in minutes. `axum::serve` offers neither setting, hence this loop.
//!
//! A connection in the listener's reserve for members (`connection_limit.rs`) is served by the
//! router behind a filter that passes only traffic between members.
//!
//! With TLS (`tls.rs`) every connection is served over TLS once its handshake, run in a task
//! of its own so that a slow client holds up no other, completes within the idle timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tower::ServiceExt as _;

use crate::auth::Token;
use crate::connection_limit::{LimitedListener, LimitedStream};
use crate::connection_metrics::{ConnectionMetrics, HandshakeFailure};
use crate::error::ApiError;
use crate::forward::FORWARDED_BY;
use crate::in_flight::{self, InFlight};
use crate::log_throttle::LogThrottle;
use crate::router::WATCH_PATH;
use crate::tls::Tls;

/// How long a connection may wait for its next request's headers unless told otherwise: above
/// the idle timeout of common HTTP clients' pools (60 s for this server's own peer client, 90 s
/// for Go's), so that they, not the server, close an idle connection and never send a request
/// on one the server is closing.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Serves a router on a [`LimitedListener`].
#[derive(Debug)]
pub struct Server {
    listener: LimitedListener,
    app: Router,
    idle_timeout: Option<Duration>,
    tls: Option<Tls>,
    metrics: ConnectionMetrics,
    /// Whose requests the members' reserve serves (the member token's holders).
    token: Token,
}

impl Server {
    /// Serves `app` on `listener`, with [`DEFAULT_IDLE_TIMEOUT`].
    pub fn new(listener: LimitedListener, app: Router) -> Self {
        Server {
            listener,
            app,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            tls: None,
            metrics: ConnectionMetrics::default(),
            token: Token::default(),
        }
    }

    /// Serves on the members' reserve only requests that carry the member token of `token`
    /// (none: any request that says it is a member's).
    pub fn token(mut self, token: Token) -> Self {
        self.token = token;
        self
    }

    /// Serves every connection over TLS with `tls`'s certificate; `None` serves plain HTTP.
    pub fn tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// Counts the listener's connections and failed TLS handshakes in `metrics` (the node's
    /// `Metrics::connections`).
    pub fn metrics(mut self, metrics: ConnectionMetrics) -> Self {
        metrics.watch(self.listener.gauge());
        self.metrics = metrics;
        self
    }

    /// Closes a connection that waits this long for a request's headers; `None` never does.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout.filter(|t| !t.is_zero());
        self
    }

    /// Serves until `shutdown` completes; then stops accepting, lets the requests in flight
    /// finish, closes idle connections, and returns once every connection is closed, or
    /// shortly after the last request was answered (a connection still receiving a request's
    /// headers does not hold it up).
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) {
        let Server {
            mut listener,
            app,
            idle_timeout,
            tls,
            metrics,
            token,
        } = self;
        if let Some(tls) = &tls {
            metrics.watch_tls(tls.clone());
        }
        let acceptor = tls.map(|tls| tls.acceptor());
        // A handshake gets as long as a request's headers: a connection of the members'
        // reserve that completes none soon is not a member's.
        let handshake_timeout = idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT);
        let members_handshake_timeout = handshake_timeout.min(MEMBERS_IDLE_TIMEOUT);
        // Clients that refused this node's certificate, logged once in a while.
        let refusals: Arc<LogThrottle<()>> = Arc::default();
        // Connections whose TLS handshake completed, to be served by this loop.
        let (secured_tx, mut secured) = tokio::sync::mpsc::channel(64);
        let mut http = hyper::server::conn::http1::Builder::new();
        // A client may send its request and then shut its side down (HTTP/1.0 style tools):
        // it still gets its answer, rather than the request running with nobody told.
        http.timer(TokioTimer::new())
            .header_read_timeout(idle_timeout)
            .half_close(true);
        // The reserve is for members, which send their next request at once (heartbeats every
        // few tens of milliseconds): a reserve connection that sends nothing for a few seconds
        // is not a member's, and must not hold a reserve slot for the whole idle timeout.
        let mut members_http = http.clone();
        members_http.header_read_timeout(Some(
            idle_timeout.map_or(MEMBERS_IDLE_TIMEOUT, |t| t.min(MEMBERS_IDLE_TIMEOUT)),
        ));
        let members_app = app
            .clone()
            .layer(axum::middleware::from_fn_with_state(token, members_only));
        let in_flight = Arc::new(InFlight::default());
        let counted = |app: Router| {
            app.layer(axum::middleware::from_fn_with_state(
                in_flight.clone(),
                in_flight::track,
            ))
        };
        let (app, members_app) = (counted(app), counted(members_app));
        let graceful = GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => Accepted::Plain(accepted),
                Some(secured) = secured.recv() => Accepted::Secured(secured),
                () = &mut shutdown => break,
            };
            let (stream, peer, members_only, hangup) = match (accepted, &acceptor) {
                (Accepted::Plain((mut stream, peer)), None) => {
                    stream.set_write_stall_limit(idle_timeout);
                    let (members_only, hangup) = (stream.members_only(), stream.hangup());
                    (Either::Left(stream), peer, members_only, hangup)
                }
                (Accepted::Plain((mut stream, peer)), Some(acceptor)) => {
                    stream.set_write_stall_limit(idle_timeout);
                    let limit = if stream.members_only() {
                        members_handshake_timeout
                    } else {
                        handshake_timeout
                    };
                    let acceptor = acceptor.clone();
                    let secured_tx = secured_tx.clone();
                    let refusals = refusals.clone();
                    let metrics = metrics.clone();
                    tokio::spawn(async move {
                        let secured = secure(acceptor, stream);
                        match tokio::time::timeout(limit, secured).await {
                            Ok(Ok(Some(stream))) => {
                                let _ = secured_tx.send((Box::new(stream), peer)).await;
                            }
                            Ok(Ok(None)) => metrics.handshake_failed(HandshakeFailure::NotTls),
                            Ok(Err(e)) => {
                                metrics.handshake_failed(handshake_failed(&refusals, peer, &e));
                            }
                            Err(_) => {
                                metrics.handshake_failed(HandshakeFailure::Timeout);
                                tracing::debug!(%peer, "TLS handshake timed out");
                            }
                        }
                    });
                    continue;
                }
                (Accepted::Secured((stream, peer)), _) => {
                    let tcp = stream.get_ref().0;
                    let (members_only, hangup) = (tcp.members_only(), tcp.hangup());
                    (Either::Right(stream), peer, members_only, hangup)
                }
            };
            let (builder, service) = if members_only {
                (&members_http, members_app.clone())
            } else {
                (&http, app.clone())
            };
            // A long poll learns when its client goes away (`hangup.rs`); other requests do
            // not wait long enough to need it.
            let service = service.map_request(move |mut request: Request<Incoming>| {
                if request.uri().path() == WATCH_PATH {
                    request.extensions_mut().insert(hangup.clone());
                }
                request
            });
            let service = TowerToHyperService::new(service);
            let connection =
                graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(%peer, "connection ended: {e}");
                }
            });
        }
        drop(listener);
        // Handshakes still running end with nobody to serve them.
        drop(secured);
        // Every connection is told to close once its request is answered; once no request is
        // being answered, those left answer nothing (a client still sending a request's
        // headers would hold the drain until its header-read timeout): they get `FLUSH_GRACE`
        // to close, for the last answers' bytes to leave, and are then left behind.
        let drained = graceful.shutdown();
        tokio::select! {
            biased;
            () = drained => {}
            () = async {
                in_flight.until_none().await;
                tokio::time::sleep(FLUSH_GRACE).await;
            } => {}
        }
    }
}

/// How long a plain HTTP request at a TLS port is read (and dropped) after its answer.
const DRAIN_PLAIN_REQUEST: Duration = Duration::from_secs(1);

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// What a plain HTTP request at a TLS port is answered, in plain HTTP, before the connection is
/// closed: a client pointed at `http://` learns why it gets no answer.
const TLS_REQUIRED: &str = r#"{"error":{"code":"tls_required","message":"this node speaks TLS only: ask https://host:port (operator commands: --tls-ca)"}}"#;

/// Runs the TLS handshake on `stream`; `None` (the connection closed) when the client sent
/// something else than a TLS handshake first: a plain HTTP request is answered
/// [`TLS_REQUIRED`].
async fn secure(
    acceptor: tokio_rustls::TlsAcceptor,
    mut stream: LimitedStream,
) -> std::io::Result<Option<TlsStream<LimitedStream>>> {
    match stream.first_byte().await? {
        Some(TLS_HANDSHAKE) => acceptor.accept(stream).await.map(Some),
        Some(b) if b.is_ascii_uppercase() => {
            use tokio::io::AsyncWriteExt as _;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{TLS_REQUIRED}",
                TLS_REQUIRED.len()
            );
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            // The request is read and dropped until the client closes (for a moment at most):
            // closing with it unread would reset the connection, and the client could lose
            // the answer.
            let mut sink = tokio::io::sink();
            let _ =
                tokio::time::timeout(DRAIN_PLAIN_REQUEST, tokio::io::copy(&mut stream, &mut sink))
                    .await;
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// Logs a failed TLS handshake, and says why it failed: at WARN (once in a while) when the
/// client refused this node's certificate, which the node cannot tell otherwise; at debug when
/// it did not speak TLS, went away, or sent garbage.
fn handshake_failed(
    refusals: &LogThrottle<()>,
    peer: std::net::SocketAddr,
    e: &std::io::Error,
) -> HandshakeFailure {
    let tls = crate::peer_client::tls_error(e);
    let Some(alert) = tls.and_then(crate::tls::refusal_of_our_certificate) else {
        tracing::debug!(%peer, "TLS handshake failed: {e}");
        return match tls {
            Some(rustls::Error::InvalidMessage(_)) => HandshakeFailure::NotTls,
            _ => HandshakeFailure::Other,
        };
    };
    match refusals.note((), (), std::time::Instant::now()) {
        Some(unlogged) => tracing::warn!(
            %peer,
            ?alert,
            unlogged,
            "a client refused this node's certificate: check that --tls-cert is current, \
             signed by an authority in the members' --tls-ca, and names the host of this \
             node's address"
        ),
        None => tracing::debug!(%peer, ?alert, "a client refused this node's certificate"),
    }
    HandshakeFailure::CertificateRefused
}

/// A connection the serving loop takes: accepted (plain, or to be secured), or secured.
enum Accepted {
    Plain((LimitedStream, std::net::SocketAddr)),
    Secured((Box<TlsStream<LimitedStream>>, std::net::SocketAddr)),
}

/// How long a shutting-down server waits, once no request is being answered, for its remaining
/// connections to close.
const FLUSH_GRACE: Duration = Duration::from_millis(500);

/// How long a connection in the members' reserve may wait for a request's headers.
pub const MEMBERS_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests a connection in the members' reserve serves besides traffic between members: the
/// probes, the metrics and the cluster status, cheap reads with which a supervisor or an
/// operator watches the node. A liveness probe that failed while datanodes fill the slots
/// would have the node restarted in the middle of a storm.
const OBSERVATION: [&str; 4] = ["/healthz", "/readyz", "/metrics", "/v1/cluster"];

/// The filter of connections in the members' reserve: Raft RPCs (`/raft/...`) and requests a
/// member forwards, carrying the member token, pass (the connection is closed after a refusal
/// only an outsider gets; a client that names a member's forward without it is no member);
/// probes and the cluster status (`GET` or `HEAD`, [`OBSERVATION`]) are answered and the connection
/// closed; anything else is answered 503 `overloaded` and the connection closed. Closing frees
/// the reserve for the members.
async fn members_only(
    axum::extract::State(token): axum::extract::State<Token>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let raft = path.starts_with("/raft/");
    let member = token.accepts_member(request.headers());
    if member && (raft || request.headers().contains_key(FORWARDED_BY)) {
        let mut response = next.run(request).await;
        // A `/raft` route refuses only what no member sends (a bad message, another cluster or
        // node, a body too large or too slow), and the token layer refuses outsiders; a
        // forwarded client request may well be refused (404, 409) by its handler.
        let status = response.status();
        let outsider = (raft && status.is_client_error())
            || matches!(
                status,
                StatusCode::UNAUTHORIZED
                    | StatusCode::REQUEST_TIMEOUT
                    | StatusCode::PAYLOAD_TOO_LARGE
            );
        if outsider {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return response;
    }
    let observes = matches!(*request.method(), Method::GET | Method::HEAD);
    let mut response = if observes && OBSERVATION.contains(&path) {
        next.run(request).await
    } else {
        ApiError::Overloaded(
            "every connection slot of this node is taken; retry after a pause".into(),
        )
        .into_response()
    };
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::{oneshot, Notify};

    use super::*;
    use crate::connection_limit::bind;

    const IDLE: Duration = Duration::from_secs(5);

    /// What `/wait` does: says it `arrived`, then answers once `release` is notified.
    #[derive(Default)]
    struct Hold {
        arrived: Notify,
        release: Notify,
    }

    /// A server with `slots` connection slots: `/` answers at once, `/wait` as `hold` says.
    /// Returns its address, the sender that shuts it down, and the serve task.
    async fn start(
        slots: usize,
        hold: Arc<Hold>,
    ) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        start_with(slots, hold, Token::default()).await
    }

    /// [`start`], its members' reserve serving only `token`'s member token.
    async fn start_with(
        slots: usize,
        hold: Arc<Hold>,
        token: Token,
    ) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/raft/ping", get(|| async { "pong" }))
            .route("/healthz", get(|| async { "alive" }))
            .route(
                "/wait",
                get(move || async move {
                    hold.arrived.notify_one();
                    hold.release.notified().await;
                    "done"
                }),
            );
        let tcp = bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = Server::new(LimitedListener::new(tcp, slots), app)
            .idle_timeout(Some(IDLE))
            .token(token);
        let task = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));
        (addr, stop, task)
    }

    /// Sends `GET path` on `tcp` and returns the response's body (read up to its length);
    /// fails unless it is a 200.
    async fn get_on(tcp: &mut TcpStream, path: &str) -> String {
        let (head, body) = exchange(tcp, &format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body
    }

    /// Sends `request` on `tcp` and returns the response's head and body.
    async fn exchange(tcp: &mut TcpStream, request: &str) -> (String, String) {
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the answer");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .expect("a content length")
                    .parse()
                    .unwrap();
                if body.len() >= len {
                    return (head.to_string(), body.to_string());
                }
            }
        }
    }

    /// Reads until the server closes the connection (failing if it has not after ten idle
    /// timeouts); returns what arrived before.
    async fn read_to_close(tcp: &mut TcpStream) -> Vec<u8> {
        let mut rest = Vec::new();
        tokio::time::timeout(IDLE * 10, tcp.read_to_end(&mut rest))
            .await
            .expect("the server closes the connection")
            .unwrap();
        rest
    }

    // Paused time: the clock jumps to the next timer whenever every task waits, so the idle
    // timeouts below pass at once and deterministically.

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_and_frees_its_slot() {
        let (addr, stop, task) = start(1, Arc::default()).await;
        // Connected, one request answered, then nothing: closed after the idle timeout.
        let mut first = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut first, "/").await, "ok");
        let before = tokio::time::Instant::now();
        assert!(read_to_close(&mut first).await.is_empty());
        assert!(before.elapsed() >= IDLE);
        // The one slot is free again: a connection that never sends a byte is served next,
        // and closed in turn.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(read_to_close(&mut silent).await.is_empty());
        let mut next = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut next, "/").await, "ok");
        drop(next);
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_answered_slower_than_the_idle_timeout_is_not_cut() {
        let hold = Arc::new(Hold::default());
        let (addr, stop, task) = start(4, hold.clone()).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let answer = tokio::spawn(async move {
            let body = get_on(&mut tcp, "/wait").await;
            (body, tcp)
        });
        hold.arrived.notified().await;
        tokio::time::sleep(IDLE * 4).await;
        assert!(!answer.is_finished());
        hold.release.notify_one();
        let (body, mut tcp) = answer.await.unwrap();
        assert_eq!(body, "done");
        // The connection lives on for its next request.
        assert_eq!(get_on(&mut tcp, "/").await, "ok");
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    /// Shutdown waits for a request in flight, closes idle connections at once, and does not
    /// wait for a client still sending a request's headers (hyper's own graceful shutdown
    /// waits for it until the header-read timeout).
    #[tokio::test(start_paused = true)]
    async fn shutdown_lets_requests_in_flight_finish_and_closes_idle_connections() {
        let hold = Arc::new(Hold::default());
        let (addr, stop, mut task) = start(4, hold.clone()).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut idle, "/").await, "ok");
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-Part: ")
            .await
            .unwrap();
        let mut busy = TcpStream::connect(addr).await.unwrap();
        let answer = tokio::spawn(async move { get_on(&mut busy, "/wait").await });
        hold.arrived.notified().await;
        let stopping = tokio::time::Instant::now();
        stop.send(()).unwrap();
        assert!(
            read_to_close(&mut idle).await.is_empty(),
            "idle closed at once"
        );
        assert!(
            tokio::time::timeout(IDLE / 10, &mut task).await.is_err(),
            "serve waits for the request in flight"
        );
        hold.release.notify_one();
        assert_eq!(answer.await.unwrap(), "done");
        task.await.unwrap();
        assert!(
            stopping.elapsed() < IDLE / 2,
            "serve returned {:?} after the stop, not after the header-read timeout",
            stopping.elapsed()
        );
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "no longer accepting"
        );
        drop(partial);
    }

    /// A client that stops reading its answer loses its connection once it has taken none of
    /// it for the idle timeout, and its slot serves the next client.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_does_not_read_its_answer_gives_its_slot_back() {
        const BIG: usize = 64 << 20;
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/big", get(|| async { vec![b'x'; BIG] }));
        let tcp = bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = Server::new(LimitedListener::new(tcp, 1), app).idle_timeout(Some(IDLE));
        let task = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));
        let mut reader = TcpStream::connect(addr).await.unwrap();
        reader
            .write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        // It reads nothing while the server writes; the server gives up on it.
        tokio::time::sleep(IDLE * 3).await;
        let mut got = Vec::new();
        let ended = tokio::time::timeout(IDLE * 10, async {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the connection was never closed");
        assert!(got.len() < BIG, "the whole answer arrived: {}", got.len());
        // Once the server has seen the close, the slot serves the next client (before that,
        // a connection lands in the reserve and is refused).
        let mut served = false;
        for _ in 0..100 {
            let mut next = TcpStream::connect(addr).await.unwrap();
            let (head, _) = exchange(&mut next, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
            if head.starts_with("HTTP/1.1 200") {
                served = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(served, "the slot was never freed");
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    /// A client that shuts its side down after its request still gets the answer.
    #[tokio::test]
    async fn a_half_closed_client_gets_its_answer() {
        let hold = Arc::new(Hold::default());
        let (addr, stop, task) = start(1, hold.clone()).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        // The answer is held a moment after the handler started, so that a server that ended
        // the connection at the EOF would have done so (this pause lets that bug show; the
        // answer's arrival does not depend on it).
        hold.arrived.notified().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        hold.release.notify_one();
        let answer = read_to_close(&mut client).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("done"), "{text}");
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    /// A connection in the members' reserve that is not a member's gives its slot back soon:
    /// one that sends nothing is closed after [`MEMBERS_IDLE_TIMEOUT`], not the idle timeout,
    /// and one whose Raft request is refused is closed after the answer.
    #[tokio::test(start_paused = true)]
    async fn the_reserve_does_not_keep_outsiders() {
        let app = Router::new().route("/", get(|| async { "ok" }));
        let tcp = bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let idle = MEMBERS_IDLE_TIMEOUT * 20;
        let server = Server::new(LimitedListener::new(tcp, 1), app).idle_timeout(Some(idle));
        let task = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));
        let mut datanode = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut datanode, "/").await, "ok");

        let mut silent = TcpStream::connect(addr).await.unwrap();
        let before = tokio::time::Instant::now();
        assert!(read_to_close(&mut silent).await.is_empty());
        assert!(before.elapsed() < idle, "{:?}", before.elapsed());

        let mut outsider = TcpStream::connect(addr).await.unwrap();
        let (head, _) = exchange(&mut outsider, "POST /raft/x HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 404"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert!(read_to_close(&mut outsider).await.is_empty());
        drop(datanode);
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_slots_a_connection_carries_only_traffic_between_members() {
        let (addr, stop, task) = start(1, Arc::default()).await;
        let mut datanode = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut datanode, "/").await, "ok");
        // The one slot is taken: the next connections come from the members' reserve.
        let mut late = TcpStream::connect(addr).await.unwrap();
        let (head, body) = exchange(&mut late, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert!(body.contains("\"overloaded\""), "{body}");
        assert!(read_to_close(&mut late).await.is_empty());
        // A probe is answered, and its connection closed so the reserve frees.
        let mut probe = TcpStream::connect(addr).await.unwrap();
        let (head, body) = exchange(&mut probe, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(body, "alive");
        assert!(read_to_close(&mut probe).await.is_empty());
        // Health checkers that ask with HEAD too.
        let mut probe = TcpStream::connect(addr).await.unwrap();
        probe
            .write_all(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let head = String::from_utf8(read_to_close(&mut probe).await).unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut peer = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut peer, "/raft/ping").await, "pong");
        let forwarded = format!("GET / HTTP/1.1\r\nHost: t\r\n{FORWARDED_BY}: 2\r\n\r\n");
        let (head, body) = exchange(&mut peer, &forwarded).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, "ok");
        // Once the slot is free again (when the server has seen the close), anyone is served.
        drop(datanode);
        let mut served = false;
        for _ in 0..100 {
            let mut next = TcpStream::connect(addr).await.unwrap();
            let (head, body) = exchange(&mut next, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
            if head.starts_with("HTTP/1.1 200") {
                assert_eq!(body, "ok");
                served = true;
                break;
            }
            assert!(body.contains("\"overloaded\""), "{head}\n{body}");
            tokio::task::yield_now().await;
        }
        assert!(served, "the freed slot was never used");
        drop(peer);
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    /// With a member token, the members' reserve serves a forwarded request only when it
    /// carries that token: a client that names a member's forward with its own token is
    /// answered as any client past the slots, and cannot crowd the members out.
    #[tokio::test(start_paused = true)]
    async fn the_members_reserve_takes_only_the_member_token() {
        let token = Token::new(Some("client")).with_member(Some("member"));
        let (addr, stop, task) = start_with(1, Arc::default(), token).await;
        let mut datanode = TcpStream::connect(addr).await.unwrap();
        assert_eq!(get_on(&mut datanode, "/").await, "ok");
        let forwarded = |token: &str| {
            format!(
                "GET / HTTP/1.1\r\nHost: t\r\n{FORWARDED_BY}: 2\r\n\
                 authorization: Bearer {token}\r\n\r\n"
            )
        };
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (head, body) = exchange(&mut client, &forwarded("client")).await;
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        assert!(body.contains("\"overloaded\""), "{body}");
        let mut member = TcpStream::connect(addr).await.unwrap();
        let (head, body) = exchange(&mut member, &forwarded("member")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, "ok");
        drop((datanode, member));
        stop.send(()).unwrap();
        task.await.unwrap();
    }
}
