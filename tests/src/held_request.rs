//! An HTTP request whose body is held back: the head and most of the body are sent, the rest only
//! when the test says so. It keeps a request "in flight" for as long as a scenario needs, without
//! timing assumptions. Or one sent whole to a paused server, whose answer is read once it runs.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request in flight.
pub struct HeldRequest {
    stream: TcpStream,
    rest: Vec<u8>,
}

impl HeldRequest {
    /// Sends the request head and all of the JSON `body` except its last `held` bytes.
    pub async fn send_partial(
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: Vec<u8>,
        held: usize,
    ) -> anyhow::Result<HeldRequest> {
        anyhow::ensure!(
            held > 0 && held <= body.len(),
            "hold between 1 and {} bytes",
            body.len()
        );
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        let split = body.len() - held;
        stream.write_all(&body[..split]).await?;
        stream.flush().await?;
        Ok(HeldRequest {
            stream,
            rest: body[split..].to_vec(),
        })
    }

    /// Sends a whole request without a body (its answer is read by [`HeldRequest::finish`]):
    /// once this returns, the request waits in the server's socket, also while its process is
    /// paused.
    pub async fn send_whole(
        addr: SocketAddr,
        method: &str,
        path: &str,
    ) -> anyhow::Result<HeldRequest> {
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await?;
        stream.flush().await?;
        Ok(HeldRequest {
            stream,
            rest: Vec::new(),
        })
    }

    /// Sends the rest of the body and returns the status and body of the answer.
    pub async fn finish(mut self, timeout: Duration) -> anyhow::Result<(u16, String)> {
        self.stream.write_all(&self.rest).await?;
        self.stream.flush().await?;
        let mut raw = Vec::new();
        tokio::time::timeout(timeout, self.stream.read_to_end(&mut raw)).await??;
        parse_response(&raw)
    }
}

fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no complete answer: {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("bad status line in {head:?}"))?;
    let body = &raw[split + 4..];
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow::anyhow!("truncated chunked body"))?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        anyhow::ensure!(body.len() >= size + 2, "truncated chunk");
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let plain = b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (409, String::from("{}")));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (200, String::from("abcde"))
        );
    }
}
