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

    /// The URL of `path_and_query` (starting with `/`) at the member at `addr` (`host:port`).
    pub fn url(&self, addr: &str, path_and_query: &str) -> String {
        format!("{}://{addr}{path_and_query}", self.scheme)
    }
}

/// `e` with every cause it wraps, `: `-separated. reqwest's own message names none ("error
/// sending request for url ..."), which makes a refused certificate read as a network failure.
pub fn failure(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        // hyper and tokio-rustls wrap errors in ones that print the same.
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// Whether `e` is a TLS exchange answered with something that is no TLS: the other side speaks
/// plain HTTP.
pub fn answered_plain(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(tls_error(e), Some(rustls::Error::InvalidMessage(_)))
}

/// The TLS error among `e`'s causes, if the exchange failed in the TLS handshake (a
/// certificate refused on either side, a peer that does not speak TLS) rather than for want of
/// a connection: then something answers at the address, but this node cannot trust it.
pub fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // tokio-rustls hands rustls's errors on inside an I/O error (itself inside another),
        // whose `source` skips the error it wraps.
        cause = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused certificate, as reqwest hands it on: a rustls error inside two I/O errors.
    #[test]
    fn a_tls_error_is_found_inside_the_errors_that_wrap_it() {
        let rustls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls);
        let outer = std::io::Error::other(inner);
        assert!(matches!(
            tls_error(&outer),
            Some(rustls::Error::InvalidCertificate(_))
        ));
        assert!(
            failure(&outer).contains("UnknownIssuer"),
            "{}",
            failure(&outer)
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(tls_error(&plain).is_none());
    }
}
