//! The listener a metaserver serves on: at most so many connections open at once, Nagle's
//! algorithm off and TCP keepalive on for each.
//!
//! Every accepted connection holds a file descriptor, as do the log's segments, the registry's
//! files, snapshots and the connections to the peers. When a registration storm opens more
//! connections than the process may hold files, accepting fails with `EMFILE`, and so does
//! everything else that opens a file or a socket: a new connection to a peer (a heartbeat, a
//! forwarded batch) or a new log segment. Measured before this limit, with the usual default
//! soft limit of 1,024 open files and 5,000 datanodes registering at once: the leader lost its
//! office and the cluster answered `no_leader` until the storm gave up. So the listener takes a
//! slot before it accepts: once every slot is taken, further connections wait in the kernel's
//! accept queue (the datanode sees a slow connect, not an error) until one closes, and the
//! descriptors outside the slots stay free for the node's own files and peers.
//!
//! The accept queue is longer than the standard library's 128 ([`ACCEPT_QUEUE`], capped by the
//! kernel's `somaxconn`): a connection that finds the queue full is not refused but has its SYN
//! dropped, and its client retries after one second, then three, and so on.
//!
//! Past the slots, [`MEMBER_CONNECTIONS`] more connections are accepted that carry only traffic
//! between members (Raft RPCs under `/raft/` and requests a member forwards): without them, a
//! node whose slots datanodes fill (a registration storm while the metaservers restart, with a
//! low open-files limit) could not be reached by its peers, and a cluster that needs an election
//! would wait until datanodes close connections, which datanodes that retry against a cluster
//! without a leader never do. A datanode's request on such a connection is answered 503
//! `overloaded` and the connection closed, so the reserve stays free for the members; probes
//! and the cluster status are answered, then the connection closed (`server.rs`).
//!
//! Nagle's algorithm is off because a streamed AppendEntries exchange writes small answers
//! back to back; with it on, each answer written while the previous one is unacknowledged
//! waits for the peer's delayed ACK (~40 ms on Linux).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::hangup::Hangup;

/// How long accepting pauses after an error that is not about one connection (for example
/// `EMFILE` when the process's other files took the descriptors the slots left free).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Connections accepted past the slots for traffic between members only; their descriptors
/// come out of the ones the slots leave free.
pub const MEMBER_CONNECTIONS: usize = 32;
/// Connections the kernel may queue for accepting (it caps this at `net.core.somaxconn`).
pub const ACCEPT_QUEUE: u32 = 4096;
/// TCP keepalive of accepted connections: the first probe after 60 s without traffic, then
/// one every 10 s; the kernel gives up on a peer after its retry count (9 on Linux), about
/// two and a half minutes.
const KEEPALIVE: socket2::TcpKeepalive = socket2::TcpKeepalive::new()
    .with_time(Duration::from_secs(60))
    .with_interval(Duration::from_secs(10));
/// "Every slot is taken" is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Binds a TCP listener to `addr` (`host:port`; the first address it resolves to that can be
/// bound) with an accept queue of [`ACCEPT_QUEUE`].
pub async fn bind(addr: &str) -> io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(addr).await? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(ACCEPT_QUEUE)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    }))
}

/// A TCP listener that keeps at most `max_connections` accepted connections open.
#[derive(Debug)]
pub struct LimitedListener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    /// [`MEMBER_CONNECTIONS`] more, for connections that only members may use.
    member_slots: Arc<Semaphore>,
    max_connections: usize,
    /// When "every slot is taken" was last logged.
    warned: Option<Instant>,
    /// When a failed accept was last logged (one every [`ACCEPT_ERROR_PAUSE`] while the
    /// process has no descriptor free would flood the log).
    accept_warned: Option<Instant>,
}

impl LimitedListener {
    /// Serves `listener` with at most `max_connections` (at least 1) connections open.
    pub fn new(listener: TcpListener, max_connections: usize) -> Self {
        let max_connections = max_connections.clamp(1, Semaphore::MAX_PERMITS);
        LimitedListener {
            listener,
            slots: Arc::new(Semaphore::new(max_connections)),
            member_slots: Arc::new(Semaphore::new(MEMBER_CONNECTIONS)),
            max_connections,
            warned: None,
            accept_warned: None,
        }
    }

    /// A handle that reads this listener's connections when asked (for the metrics).
    pub fn gauge(&self) -> ConnectionGauge {
        ConnectionGauge {
            slots: self.slots.clone(),
            member_slots: self.member_slots.clone(),
            max: self.max_connections,
        }
    }

    /// Connections open now, in slots and in the members' reserve.
    pub fn open_connections(&self) -> usize {
        self.max_connections + MEMBER_CONNECTIONS
            - self.slots.available_permits()
            - self.member_slots.available_permits()
    }

    /// Takes a slot, else one of the members' reserve (`true`), waiting for a connection to
    /// close if none is free.
    async fn slot(&mut self) -> (OwnedSemaphorePermit, bool) {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return (slot, false);
        }
        if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            tracing::warn!(
                max_connections = self.max_connections,
                "every connection slot is taken; new connections serve only traffic between \
                 members, or wait until one closes"
            );
            self.warned = Some(Instant::now());
        }
        let closed = "the listener's semaphores are never closed";
        tokio::select! {
            biased;
            slot = self.slots.clone().acquire_owned() => (slot.expect(closed), false),
            slot = self.member_slots.clone().acquire_owned() => (slot.expect(closed), true),
        }
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (LimitedStream, SocketAddr) {
        loop {
            let (mut slot, mut members_only) = self.slot().await;
            match self.listener.accept().await {
                Ok((tcp, addr)) => {
                    // A reserve place was taken while every slot was busy; a connection that
                    // closed while this waited for the next one freed a slot, which goes first.
                    if members_only {
                        if let Ok(freed) = self.slots.clone().try_acquire_owned() {
                            (slot, members_only) = (freed, false);
                        }
                    }
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!("could not set TCP_NODELAY on an accepted connection: {e}");
                    }
                    if let Err(e) = socket2::SockRef::from(&tcp).set_tcp_keepalive(&KEEPALIVE) {
                        tracing::debug!(
                            "could not set TCP keepalive on an accepted connection: {e}"
                        );
                    }
                    let stream = LimitedStream {
                        tcp: Arc::new(tcp),
                        members_only,
                        _slot: slot,
                        stall_limit: None,
                        stalled: None,
                    };
                    return (stream, addr);
                }
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    if self
                        .accept_warned
                        .is_none_or(|at| at.elapsed() >= WARN_EVERY)
                    {
                        tracing::warn!("accepting a connection failed: {e}");
                        self.accept_warned = Some(Instant::now());
                    }
                    drop(slot);
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A listener's connections, read when asked ([`LimitedListener::gauge`]).
#[derive(Clone, Debug)]
pub struct ConnectionGauge {
    slots: Arc<Semaphore>,
    member_slots: Arc<Semaphore>,
    max: usize,
}

impl ConnectionGauge {
    /// Connections open in the slots.
    pub fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// Connections open in the members' reserve (only while every slot is taken).
    pub fn open_in_reserve(&self) -> usize {
        MEMBER_CONNECTIONS - self.member_slots.available_permits()
    }

    /// The slots.
    pub fn slots(&self) -> usize {
        self.max
    }
}

/// Errors about one connection (which went away before it was accepted), not the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// An accepted connection; closing it frees its slot.
///
/// The socket is shared with the [`Hangup`] handles a request may take to learn that its client
/// went away; reads and writes go through the socket's shared readiness (`try_read`,
/// `try_write`), as tokio's own stream does.
#[derive(Debug)]
pub struct LimitedStream {
    tcp: Arc<TcpStream>,
    members_only: bool,
    _slot: OwnedSemaphorePermit,
    /// How long a write may wait for the client to take bytes; `None`: for ever.
    stall_limit: Option<Duration>,
    /// Running while a write waits for the client to take bytes.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LimitedStream {
    /// Whether this connection holds one of the members' reserve: it may carry only traffic
    /// between members.
    pub fn members_only(&self) -> bool {
        self.members_only
    }

    /// The first byte the client sent, left unread; `None` if it closed without sending one.
    pub async fn first_byte(&self) -> io::Result<Option<u8>> {
        let mut byte = [0u8; 1];
        let n = self.tcp.peek(&mut byte).await?;
        Ok((n == 1).then_some(byte[0]))
    }

    /// A handle that tells when the client closes its side of this connection.
    pub fn hangup(&self) -> Hangup {
        Hangup::new(self.tcp.clone())
    }

    /// Fails a write (and so ends the connection) once the client has taken none of its
    /// answer for `limit`: a client that stops reading would otherwise hold its slot, and the
    /// answer's memory, for ever. A client that reads slowly is not cut.
    pub fn set_write_stall_limit(&mut self, limit: Option<Duration>) {
        self.stall_limit = limit;
    }

    /// Tracks a write's progress: `Pending` starts (or keeps) the stall timer, anything else
    /// stops it; a stall past the limit turns into an error.
    fn watch_stall<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let Some(limit) = self.stall_limit else {
            return polled;
        };
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took none of its answer for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            std::task::ready!(self.tcp.poll_read_ready(cx))?;
            match self.tcp.try_read_buf(buf) {
                // A false readiness (the bytes were taken, or a `Hangup` looked at the socket)
                // is cleared by the attempt: the next poll waits for the next event.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
                Ok(_) => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// Writes with `write` once the socket may take bytes, as tokio's `TcpStream` does.
fn poll_write_with<T>(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    write: impl Fn(&TcpStream) -> io::Result<T>,
) -> Poll<io::Result<T>> {
    loop {
        std::task::ready!(tcp.poll_write_ready(cx))?;
        match write(tcp) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            written => return Poll::Ready(written),
        }
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = poll_write_with(&self.tcp, cx, |tcp| tcp.try_write(buf));
        self.watch_stall(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = poll_write_with(&self.tcp, cx, |tcp| tcp.try_write_vectored(bufs));
        self.watch_stall(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// TCP has nothing to flush.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.watch_stall(cx, Poll::Ready(Ok(())))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match socket2::SockRef::from(&*self.tcp).shutdown(std::net::Shutdown::Write) {
            // The client went away first: nothing is left to shut down.
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
            shut => Poll::Ready(shut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener;
    use futures::FutureExt;

    #[tokio::test]
    async fn a_connection_past_the_limit_waits_until_one_closes() {
        let tcp = bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut listener = LimitedListener::new(tcp, 2);
        let mut clients = Vec::new();
        for _ in 0..2 + MEMBER_CONNECTIONS + 1 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let (first, _) = listener.accept().await;
        let (second, _) = listener.accept().await;
        assert!(first.tcp.nodelay().unwrap());
        assert!(socket2::SockRef::from(&*first.tcp).keepalive().unwrap());
        assert!(!first.members_only() && !second.members_only());
        assert_eq!(listener.open_connections(), 2);
        // Past the slots, the members' reserve.
        let mut reserve = Vec::new();
        for _ in 0..MEMBER_CONNECTIONS {
            let (stream, _) = listener.accept().await;
            assert!(stream.members_only());
            reserve.push(stream);
        }
        assert_eq!(listener.open_connections(), 2 + MEMBER_CONNECTIONS);
        // The last client is connected (the kernel queued it) but not accepted: no slot.
        let mut last = Box::pin(listener.accept());
        assert!((&mut last).now_or_never().is_none());
        drop(second);
        let (last, _) = tokio::time::timeout(Duration::from_secs(10), last)
            .await
            .expect("a closed connection frees its slot");
        assert!(
            !last.members_only(),
            "a freed slot is taken before the reserve"
        );
        assert_eq!(listener.open_connections(), 2 + MEMBER_CONNECTIONS);
        drop((first, last, reserve));
        assert_eq!(listener.open_connections(), 0);
    }

    /// Every slot busy, the listener waits for the next connection with a reserve place in
    /// hand; a slot freed meanwhile still goes to that connection, which is not a member's.
    #[tokio::test]
    async fn a_slot_freed_while_the_listener_waits_goes_to_the_next_connection() {
        let tcp = bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut listener = LimitedListener::new(tcp, 1);
        let _client = TcpStream::connect(addr).await.unwrap();
        let (first, _) = listener.accept().await;
        assert!(!first.members_only());
        let mut next = Box::pin(listener.accept());
        assert!((&mut next).now_or_never().is_none(), "no connection yet");
        drop(first);
        let _second = TcpStream::connect(addr).await.unwrap();
        let (second, _) = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the queued connection is accepted");
        assert!(
            !second.members_only(),
            "it took the reserve though a slot was free"
        );
        assert_eq!(listener.open_connections(), 1);
    }

    #[tokio::test]
    async fn bind_resolves_names_and_refuses_what_does_not_resolve() {
        // `localhost` resolves from the hosts file, to a loopback address.
        let listener = bind("localhost:0").await.unwrap();
        assert!(listener.local_addr().unwrap().ip().is_loopback());
        // Refused without a lookup (one of a name that does not exist would ask DNS).
        assert!(bind("127.0.0.1:notaport").await.is_err(), "bad port");
        assert!(bind("127.0.0.1").await.is_err(), "no port");
    }
}
