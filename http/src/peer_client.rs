//! The pooled HTTP client a node speaks to other members with (Raft messages, forwarded
//! requests, probes), plain or over TLS, and the URLs it asks them at.

use std::time::Duration;

use crate::tls::Tls;

/// How long connecting to a peer (with the TLS handshake, if any) may take before it counts as
/// unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A pooled client for other members, and the scheme they are spoken to with: `https` when
/// this node has TLS (every member of a cluster has, or none), else `http`. Cloning shares the
/// pool.
#[derive(Clone, Debug)]
pub struct PeerClient {
    http: reqwest::Client,
    scheme: &'static str,
}

impl PeerClient {
    /// A client that speaks plain HTTP.
    pub fn plain() -> Self {
        Self::new(None)
    }

    /// A client that speaks TLS, trusting `tls`'s authorities, if given; else plain HTTP.
    pub fn new(tls: Option<&Tls>) -> Self {
        let builder = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT)
            // Below the members' reserve's header timeout, so that a pooled connection is
            // never used just as the other member closes it (the request would be lost in
            // between, and its outcome unknown).
            .pool_idle_timeout(crate::server::MEMBERS_IDLE_TIMEOUT - Duration::from_secs(1))
            .pool_max_idle_per_host(64)
            .tcp_keepalive(Duration::from_secs(30));
        let (builder, scheme) = match tls {
            Some(tls) => (
                builder
                    .use_preconfigured_tls(tls.client_config())
                    .https_only(true),
                "https",
            ),
            None => (builder, "http"),
        };
        PeerClient {
            http: builder
                .build()
                .expect("building an HTTP client with a preconfigured TLS setup cannot fail"),
            scheme,
        }
    }

    /// The client.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The URL of `path_and_query` (starting with `/`) at the member at `addr` (`host:port`).
    pub fn url(&self, addr: &str, path_and_query: &str) -> String {
        format!("{}://{addr}{path_and_query}", self.scheme)
    }
}
