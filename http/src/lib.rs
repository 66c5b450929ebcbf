//! The metaserver's HTTP layer: the admin API (`/v1/...`), its error mapping, metrics and
//! token authentication, and the Raft transport between processes (`/raft/...`).
//!
//! It talks to the node API of `meta-consensus` only, never to the log or the registry
//! directly.

pub mod append_stream;
pub mod auth;
pub mod error;
pub mod extract;
pub mod forward;
pub mod forward_batch;
pub mod frame;
pub mod handlers;
pub mod limits;
pub mod metrics;
pub mod network;
pub mod node_metrics;
pub mod raft_routes;
pub mod request;
pub mod response;
pub mod router;
pub mod state;
pub mod writer;

pub use auth::Token;
pub use error::ApiError;
pub use metrics::Metrics;
pub use network::HttpNetwork;
pub use router::router;
pub use state::AppState;

/// The listener a metaserver serves on: `listener` with Nagle's algorithm off on every accepted
/// connection. A streamed AppendEntries exchange writes small answers back to back; with Nagle
/// on, each answer written while the previous one is unacknowledged waits for the peer's
/// delayed ACK (~40 ms on Linux).
pub fn listener(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("could not set TCP_NODELAY on an accepted connection: {e}");
        }
    })
}
