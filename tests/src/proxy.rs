//! A TCP proxy in front of one node, through which every other node reaches it (the node's address
//! in the cluster membership). While a link is cut it learns which node opened each connection (see
//! [`crate::socket_owner`]), so a test can cut single directed links: a partition needs no
//! test-only code in the server. It can also slow the traffic into its node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

use crate::socket_owner::{pid_holding_socket, socket_inode};

/// Node ids of the cluster's processes by pid, shared by all proxies of a cluster.
#[derive(Clone, Default)]
pub struct PidTable(Arc<Mutex<BTreeMap<u32, u64>>>);

impl PidTable {
    /// Records that `pid` is node `node`.
    pub fn insert(&self, pid: u32, node: u64) {
        self.0.lock().unwrap().insert(pid, node);
    }

    /// Forgets `pid`.
    pub fn remove(&self, pid: u32) {
        self.0.lock().unwrap().remove(&pid);
    }

    fn snapshot(&self) -> Vec<(u32, u64)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(p, n)| (*p, *n))
            .collect()
    }
}

struct Shared {
    target: Mutex<Option<SocketAddr>>,
    blocked: Mutex<BTreeSet<u64>>,
    rate: Mutex<Option<u64>>,
    conns: Mutex<Vec<(Option<u64>, AbortHandle)>>,
    pids: PidTable,
}

/// The proxy for connections *to* one node.
pub struct LinkProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl LinkProxy {
    /// Binds a proxy for one node on an ephemeral loopback port. It forwards nothing until
    /// [`LinkProxy::set_target`] names the node's real address.
    pub async fn bind(pids: PidTable) -> anyhow::Result<LinkProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(None),
            blocked: Mutex::new(BTreeSet::new()),
            rate: Mutex::new(None),
            conns: Mutex::new(Vec::new()),
            pids,
        });
        let accept = tokio::spawn(accept_loop(listener, addr, shared.clone()));
        Ok(LinkProxy {
            addr,
            shared,
            accept,
        })
    }

    /// The address the other nodes use for this node.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where connections are forwarded; `None` while the node is down (connections are closed).
    pub fn set_target(&self, target: Option<SocketAddr>) {
        *self.shared.target.lock().unwrap() = target;
        if target.is_none() {
            self.abort_where(|_| true);
        }
    }

    /// Cuts the link from node `from` to this node: open connections from it are dropped (and those
    /// opened while no link was cut, whose origin was not looked up), new ones from it are closed.
    pub fn block(&self, from: u64) {
        self.shared.blocked.lock().unwrap().insert(from);
        self.abort_where(|source| source == Some(from) || source.is_none());
    }

    /// Limits each connection's bytes per second towards the node (`None`: no limit). Takes effect
    /// at the next chunk of open connections too.
    pub fn set_rate(&self, bytes_per_sec: Option<u64>) {
        *self.shared.rate.lock().unwrap() = bytes_per_sec;
    }

    /// Restores every link to this node.
    pub fn unblock_all(&self) {
        self.shared.blocked.lock().unwrap().clear();
    }

    fn abort_where(&self, pred: impl Fn(Option<u64>) -> bool) {
        let mut conns = self.shared.conns.lock().unwrap();
        conns.retain(|(source, handle)| {
            if pred(*source) {
                handle.abort();
                false
            } else {
                !handle.is_finished()
            }
        });
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.abort_where(|_| true);
    }
}

async fn accept_loop(listener: TcpListener, local: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let shared2 = shared.clone();
        tokio::spawn(async move {
            let Some(target) = *shared2.target.lock().unwrap() else {
                return;
            };
            // Who opened the connection matters only while a link to this node is cut: finding
            // out costs a scan of the system's socket table, so it is skipped otherwise.
            let cut = !shared2.blocked.lock().unwrap().is_empty();
            let source = if cut {
                let pids = shared2.pids.clone();
                match tokio::task::spawn_blocking(move || identify(&pids, peer, local)).await {
                    Ok(Ok(node)) if !shared2.blocked.lock().unwrap().contains(&node) => Some(node),
                    // Cut, or unknown (fail closed, so a partition never leaks).
                    _ => return,
                }
            } else {
                None
            };
            let task = tokio::spawn(pipe(stream, target, shared2.clone()));
            let mut conns = shared2.conns.lock().unwrap();
            conns.retain(|(_, handle)| !handle.is_finished());
            // A cut that raced with this connection's setup still applies to it.
            let blocked = {
                let blocked = shared2.blocked.lock().unwrap();
                match source {
                    Some(node) => blocked.contains(&node),
                    None => !blocked.is_empty(),
                }
            };
            if blocked || shared2.target.lock().unwrap().is_none() {
                task.abort();
            } else {
                conns.push((source, task.abort_handle()));
            }
        });
    }
}

async fn pipe(client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let _ = paced_copy(&mut client_read, &mut server_write, &shared).await;
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Copies like `tokio::io::copy`, but keeps to the proxy's rate (if any) by pacing each chunk
/// against an absolute schedule.
async fn paced_copy(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    shared: &Shared,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut paced: Option<(Instant, u64, u64)> = None; // (start, bytes since start, rate)
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
        let rate = *shared.rate.lock().unwrap();
        match rate {
            None | Some(0) => paced = None,
            Some(rate) => {
                let (start, sent, _) = match paced {
                    Some((start, sent, r)) if r == rate => (start, sent, r),
                    _ => (Instant::now(), 0, rate),
                };
                let sent = sent + n as u64;
                paced = Some((start, sent, rate));
                let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
            }
        }
    }
}

/// Runs inline: reading `/proc/net/tcp` and three descriptor tables takes well under a
/// millisecond, and a delay here lets short-lived client sockets vanish before they are seen.
fn identify(pids: &PidTable, peer: SocketAddr, local: SocketAddr) -> Result<u64, String> {
    let table = pids.snapshot();
    let inode = socket_inode(peer, local).ok_or("no such socket in /proc/net/tcp")?;
    let pid_list: Vec<u32> = table.iter().map(|(pid, _)| *pid).collect();
    let pid = pid_holding_socket(&pid_list, inode)
        .ok_or_else(|| format!("socket {inode} is held by none of the pids {pid_list:?}"))?;
    table
        .iter()
        .find(|(p, _)| *p == pid)
        .map(|(_, node)| *node)
        .ok_or_else(|| String::from("pid vanished"))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// One ping through `addr`; a proxy that neither forwards nor closes fails it after 10 s.
    async fn round_trip(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let exchange = async {
            let mut stream = TcpStream::connect(addr).await?;
            stream.write_all(b"ping").await?;
            let mut buf = [0u8; 4];
            stream.read_exact(&mut buf).await?;
            Ok(buf.to_vec())
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), exchange)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 10 s"))?
    }

    #[tokio::test]
    async fn forwards_and_cuts_by_source_process() {
        let pids = PidTable::default();
        pids.insert(std::process::id(), 7);
        let proxy = LinkProxy::bind(pids).await.unwrap();
        proxy.set_target(Some(echo_server().await));
        assert_eq!(round_trip(proxy.addr()).await.unwrap(), b"ping");

        // An open connection from node 7 is dropped when its link is cut.
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        open.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        open.read_exact(&mut buf).await.unwrap();
        proxy.block(7);
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            open.read_to_end(&mut rest),
        )
        .await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        assert!(round_trip(proxy.addr()).await.is_err());

        proxy.unblock_all();
        assert_eq!(round_trip(proxy.addr()).await.unwrap(), b"ping");
        proxy.set_target(None);
        assert!(round_trip(proxy.addr()).await.is_err());
    }
}
