//! Which process opened a loopback TCP connection, found through `/proc` (Linux): lets one proxy per
//! destination node tell the Raft traffic of different source nodes apart without any help from them.

use std::net::{IpAddr, SocketAddr};

/// The inode of the socket whose local end is `local` and remote end is `remote` (IPv4 only).
pub fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let want_local = proc_addr(local)?;
    let want_remote = proc_addr(remote)?;
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() > 9 && fields[1] == want_local && fields[2] == want_remote {
            fields[9].parse().ok()
        } else {
            None
        }
    })
}

/// Which of `pids` holds a descriptor for the socket `inode`.
pub fn pid_holding_socket(pids: &[u32], inode: u64) -> Option<u32> {
    let needle = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        entries.flatten().any(|entry| {
            std::fs::read_link(entry.path())
                .map(|target| target.as_os_str() == needle.as_str())
                .unwrap_or(false)
        })
    })
}

/// `/proc/net/tcp` spells 127.0.0.1:8080 as `0100007F:1F90` (address in host byte order).
fn proc_addr(addr: SocketAddr) -> Option<String> {
    let IpAddr::V4(ip) = addr.ip() else {
        return None;
    };
    let [a, b, c, d] = ip.octets();
    let ip_hex = if cfg!(target_endian = "little") {
        format!("{d:02X}{c:02X}{b:02X}{a:02X}")
    } else {
        format!("{a:02X}{b:02X}{c:02X}{d:02X}")
    };
    Some(format!("{ip_hex}:{:04X}", addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_process_for_a_loopback_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        let inode = socket_inode(peer, listener.local_addr().unwrap()).expect("socket listed");
        assert_eq!(
            pid_holding_socket(&[std::process::id()], inode),
            Some(std::process::id())
        );
        drop(client);
    }

    #[test]
    fn spells_addresses_like_proc() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(proc_addr(addr).unwrap(), "0100007F:1F90");
    }
}
