//! TLS for the API and between members: a node's certificate and key, which it answers every
//! connection with, and the certificate authority it checks other members' certificates
//! against when it connects to them.
//!
//! A node either speaks TLS on its one port or plain HTTP, never both: a cluster is all TLS or
//! all plain. Clients are not asked for certificates; the token (`auth.rs`) says who may ask.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or held no PEM item of the kind wanted.
    #[error("reading {what} from {path}: {message}")]
    File {
        /// What the file was to hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be used.
        message: String,
    },
    /// The files were read but do not make a working configuration (a key that is not the
    /// certificate's, a certificate rustls cannot parse).
    #[error("{0}")]
    Config(String),
}

/// A node's TLS: what it answers connections with, and what it trusts when it connects.
#[derive(Clone)]
pub struct Tls {
    server: Arc<rustls::ServerConfig>,
    roots: Arc<rustls::RootCertStore>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads the node's certificate chain (`cert`, PEM, its own certificate first), its
    /// private key (`key`, PEM) and the certificate authorities it trusts (`ca`, PEM, one or
    /// more certificates). Fails, naming the file, when one cannot be read or the key does not
    /// go with the certificate.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<Tls, TlsError> {
        let chain = certificates(cert, "the certificate")?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
            what: "the private key",
            path: key.to_owned(),
            message: e.to_string(),
        })?;
        let roots = roots(ca)?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| {
                TlsError::Config(format!(
                    "the certificate {} and the key do not make a TLS identity: {e}",
                    cert.display()
                ))
            })?;
        Ok(Tls {
            server: Arc::new(server),
            roots: Arc::new(roots),
        })
    }

    /// Accepts TLS connections with the node's certificate.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    /// A client configuration that trusts the loaded authorities only.
    pub fn client_config(&self) -> rustls::ClientConfig {
        client_config(self.roots.clone())
    }
}

/// A client configuration that trusts the authorities in `ca` (PEM) only: what an operator's
/// command or a test uses to talk to a TLS cluster.
pub fn client_config_from(ca: &Path) -> Result<rustls::ClientConfig, TlsError> {
    Ok(client_config(Arc::new(roots(ca)?)))
}

fn client_config(roots: Arc<rustls::RootCertStore>) -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the aws-lc-rs provider supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |message: String| TlsError::File {
        what,
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

fn roots(ca: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca, "the certificate authority")? {
        roots.add(cert).map_err(|e| TlsError::File {
            what: "the certificate authority",
            path: ca.to_owned(),
            message: e.to_string(),
        })?;
    }
    Ok(roots)
}
