//! The metaserver's HTTP layer: the admin API (`/v1/...`), its error mapping, metrics and
//! token authentication, and the Raft transport between processes (`/raft/...`).
//!
//! It talks to the node API of `meta-consensus` only, never to the log or the registry
//! directly.

pub mod answer_budget;
pub mod append_stream;
pub mod auth;
pub mod bounded_body;
pub mod cluster_identity;
pub mod connection_limit;
pub mod connection_metrics;
pub mod disk_alarm;
pub mod disk_handover;
pub mod error;
pub mod extract;
pub mod failover;
pub mod follower_read;
pub mod forward;
pub mod forward_batch;
pub mod frame;
pub mod handlers;
pub mod hangup;
mod in_flight;
mod leader_exchange;
pub mod limits;
mod log_throttle;
pub mod metrics;
pub mod network;
pub mod node_metrics;
pub mod peer_client;
pub mod raft_routes;
pub mod raw_path;
#[cfg(test)]
mod refused_port;
pub mod removal_notices;
pub mod request;
pub mod response;
pub mod router;
pub mod server;
pub mod state;
mod term_probe;
pub mod tls;
pub mod writer;

pub use auth::Token;
pub use connection_limit::LimitedListener;
pub use error::ApiError;
pub use metrics::Metrics;
pub use network::HttpNetwork;
pub use peer_client::PeerClient;
pub use router::router;
pub use server::Server;
pub use state::AppState;
pub use tls::{Tls, TlsError};
