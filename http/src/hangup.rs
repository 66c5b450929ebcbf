//! Telling that a client went away while its request waits. A long poll holds a watch slot and
//! a connection slot for up to its whole wait (55 s at most); one whose client gave up (a
//! client-side timeout, a restarted watcher) would hold both for nobody. The server hands a
//! waiting request a [`Hangup`] on its connection's socket, and the request stops waiting once
//! the client has closed its side.
//!
//! A client that closes only its sending side (HTTP/1.0-style tools) looks the same: the long
//! poll then answers at once, with what it has, and that client still reads the answer. Bytes
//! the client sends after its request (a pipelined request, or TLS records such as a TLS
//! `close_notify`) hide the end behind them: the handle then never completes, and the request
//! waits as before.

use std::sync::Arc;

use tokio::net::TcpStream;

/// A handle on a connection's socket, shared with the connection: [`Hangup::closed`] completes
/// once the client has closed its side.
#[derive(Clone, Debug)]
pub struct Hangup {
    tcp: Arc<TcpStream>,
}

impl Hangup {
    pub(crate) fn new(tcp: Arc<TcpStream>) -> Self {
        Hangup { tcp }
    }

    /// Completes once the client has closed its side of the connection (end of stream), or the
    /// connection failed; never while the client keeps it open and sends nothing, and never
    /// once the client sent bytes that nobody read yet (the end, if it comes, is behind them).
    /// Reads nothing: the connection's own reads see every byte.
    pub async fn closed(&self) {
        let mut byte = [0u8; 1];
        match self.tcp.peek(&mut byte).await {
            Ok(0) | Err(_) => {}
            Ok(_) => std::future::pending().await,
        }
    }
}
