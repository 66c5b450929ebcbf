//! A body over the limit, sent whole over a real connection: the client sends it all and reads
//! the 413. The server used to close with the rest of the body unread, and a client that gives
//! up at a failed send (most do) saw "connection reset", not the answer.

mod common;

use common::leader_node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Serves `t`'s node on a real listener, as a member does.
async fn serve(t: &common::TestNode) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let state = meta_http::AppState::new(t.node.clone(), meta_http::Token::new(None));
    let tcp = meta_http::connection_limit::bind("127.0.0.1:0")
        .await
        .unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = meta_http::Server::new(
        meta_http::LimitedListener::new(tcp, 16),
        meta_http::router(state),
    );
    tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// Sends `head` and a body of `len` bytes whole (as most clients do, not waiting for an early
/// answer), then reads the answer to its end: whether every byte could be sent (many clients
/// give up at a failed send, never reading the answer), and the answer's status line, or
/// what went wrong.
async fn send_whole(addr: std::net::SocketAddr, head: String, len: usize) -> (bool, String) {
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min(len - sent);
        // The server may close once it answered; what it answered is read below.
        if client.write_all(&chunk[..n]).await.is_err() {
            break;
        }
        sent += n;
    }
    let mut answer = Vec::new();
    let status = match client.read_to_end(&mut answer).await {
        Ok(_) => String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
        Err(e) => format!("read failed: {e}"),
    };
    (sent == len, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_an_oversized_body_whole_reads_its_413() {
    let t = leader_node(None).await;
    let (addr, _stop) = serve(&t).await;
    let before = t.digest().await;
    let len = 8 << 20;
    for round in 0..5 {
        let declared =
            format!("PUT /v1/kv/big HTTP/1.1\r\nHost: t\r\nContent-Length: {len}\r\n\r\n");
        let (whole, status) = send_whole(addr, declared, len).await;
        assert!(status.contains(" 413 "), "round {round}: {status}");
        assert!(whole, "round {round}: the body could not be sent whole");
    }
    assert_eq!(t.digest().await, before, "nothing was written");
}
