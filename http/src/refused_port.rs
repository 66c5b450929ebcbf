//! For tests: a loopback port that refuses connections and stays reserved while the test runs.
//! Binding a listener, reading its port and closing it leaves the port free for another test of
//! the same binary to take meanwhile; a socket bound without listening keeps it, and the kernel
//! refuses connections to it.

/// A bound, not listening, loopback socket; connections to its port are refused while it lives.
pub(crate) struct RefusedPort {
    _socket: socket2::Socket,
    pub port: u16,
}

impl RefusedPort {
    pub(crate) fn new() -> RefusedPort {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a TCP socket");
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
        socket.bind(&any.into()).expect("binding a loopback port");
        let port = socket
            .local_addr()
            .expect("its address")
            .as_socket()
            .expect("an IP address")
            .port();
        RefusedPort {
            _socket: socket,
            port,
        }
    }
}
