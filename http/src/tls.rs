//! TLS for the API and between members: a node's certificate and key, which it answers every
//! connection with, and the certificate authorities it checks other members' certificates
//! against when it connects to them.
//!
//! A node either speaks TLS on its one port or plain HTTP, never both: a cluster is all TLS or
//! all plain. Clients are not asked for certificates; the token (`auth.rs`) says who may ask.
//!
//! The files are read again while the node runs ([`Tls::keep_fresh`]): a renewed certificate,
//! or a new authority, takes effect for the connections made after it, with no restart. A
//! change that does not make a working set (a certificate written before its key) is not
//! taken, and the node keeps what it has.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};

/// How often [`Tls::keep_fresh`] reads the files again.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// A certificate that expires within this long is warned about.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 86_400);

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
/// Cloning shares it: a reload reaches every clone.
#[derive(Clone)]
pub struct Tls {
    files: Arc<Files>,
    identity: Arc<Identity>,
    trust: Arc<Trust>,
    server: Arc<rustls::ServerConfig>,
    /// The files' bytes as last taken, or last refused (with whether they were taken): a
    /// refused set is not tried (and logged) again until one of them changes.
    seen: Arc<Mutex<(Contents, bool)>>,
    /// Why the files could not be read at the last reload, if they could not: a file that
    /// stays missing is reported once, not at every reload.
    unreadable: Arc<Mutex<Option<String>>>,
    /// Whether the files, as the last reload found them, are refused (or cannot be read): the
    /// node then runs with the ones it took before.
    refused: Arc<AtomicBool>,
    /// Why the set last refused was (see [`Tls::refusal`]); a file that cannot be read says
    /// why in `unreadable`.
    refusal: Arc<Mutex<Option<String>>>,
    /// The last second at which the members accept the certificate taken last
    /// ([`Tls::accepted_until`]), worked out when it was taken.
    accepted_until: Arc<AtomicU64>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// Where the node's TLS is read from.
#[derive(Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// What the files make: the node's identity and what the members' certificates are checked
/// against.
struct Loaded {
    identity: Arc<CertifiedKey>,
    trusted: Trusted,
}

/// The authorities of `--tls-ca`, and the verifier of the members' certificates they make.
#[derive(Debug, Clone)]
struct Trusted {
    verifier: Arc<WebPkiServerVerifier>,
    roots: Arc<rustls::RootCertStore>,
}

/// What the three files held when read: what is parsed, and what a later read is compared
/// with.
#[derive(PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

impl Files {
    /// Reads the three files.
    fn read(&self) -> Result<Contents, TlsError> {
        let read = |what, path: &Path| std::fs::read(path).map_err(|e| file_error(what, path, e));
        Ok(Contents {
            cert: read("the certificate", &self.cert)?,
            key: read("the private key", &self.key)?,
            ca: read("the certificate authority", &self.ca)?,
        })
    }

    /// Checks `identity` as a member checks this node's certificate (against `roots`) when it
    /// connects to `host`, at `now`: the chain and its validity always, the name with a host.
    fn check_identity(
        &self,
        identity: &CertifiedKey,
        roots: &rustls::RootCertStore,
        host: Option<&str>,
        now: UnixTime,
    ) -> Result<(), TlsError> {
        let at = host.map(|h| format!(" at {h}")).unwrap_or_default();
        let refused = |why: String| {
            TlsError::Config(format!(
                "the other members would refuse this node's certificate {}{at}: {why}",
                self.cert.display()
            ))
        };
        let (end_entity, intermediates) = identity
            .cert
            .split_first()
            .ok_or_else(|| refused("the file holds no certificate".into()))?;
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)
            .map_err(|e| refused(e.to_string()))?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            roots,
            intermediates,
            now,
            provider().signature_verification_algorithms.all,
        )
        .map_err(|e| {
            refused(format!(
                "{e} (it must be signed by an authority of {}, and be valid now)",
                self.ca.display()
            ))
        })?;
        let Some(host) = host else {
            return Ok(());
        };
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .map_err(|e| refused(format!("{host:?} is no host name or IP address ({e})")))?;
        rustls::client::verify_server_name(&parsed, &name)
            .map_err(|e| refused(format!("{e} (it must name {host})")))
    }

    /// Parses and checks what the files held: the key must be the certificate's.
    fn load(&self, contents: &Contents) -> Result<Loaded, TlsError> {
        let provider = provider();
        let chain = certificates(&contents.cert, &self.cert, "the certificate")?;
        let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
            let encrypted = String::from_utf8_lossy(&contents.key).contains("ENCRYPTED");
            let why = if encrypted {
                "the key is encrypted: give it unencrypted (`openssl pkey -in KEY -out PLAIN`), \
                 readable by this user only"
                    .to_string()
            } else if matches!(e, rustls::pki_types::pem::Error::NoItemsFound) {
                "no PEM private key in the file".to_string()
            } else {
                e.to_string()
            };
            file_error("the private key", &self.key, why)
        })?;
        let identity = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
            let why = match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    "the key is not the certificate's".to_string()
                }
                // webpki's error, boxed: it read as a key problem.
                e if format!("{e:?}").contains("UnsupportedCertVersion") => {
                    "the certificate is X.509 version 1, which has no extensions (`openssl x509 \
                     -req` without `-extfile` makes one): it needs version 3, with a \
                     subjectAltName naming this node's host"
                        .to_string()
                }
                e => e.to_string(),
            };
            TlsError::Config(format!(
                "the certificate {} and the key {} do not make a TLS identity: {why}",
                self.cert.display(),
                self.key.display()
            ))
        })?;
        let roots = Arc::new(roots(&contents.ca, &self.ca)?);
        let verifier =
            WebPkiServerVerifier::builder_with_provider(roots.clone(), Arc::new(provider))
                .build()
                .map_err(|e| {
                    TlsError::Config(format!(
                        "the certificate authority {}: {e}",
                        self.ca.display()
                    ))
                })?;
        Ok(Loaded {
            identity: Arc::new(identity),
            trusted: Trusted { verifier, roots },
        })
    }
}

impl Tls {
    /// Loads the node's certificate chain (`cert`, PEM, its own certificate first), its
    /// private key (`key`, PEM) and the certificate authorities it trusts (`ca`, PEM, one or
    /// more certificates). Fails, naming the file, when one cannot be read or the key does not
    /// go with the certificate.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<Tls, TlsError> {
        let files = Files {
            cert: cert.to_owned(),
            key: key.to_owned(),
            ca: ca.to_owned(),
        };
        let seen = files.read()?;
        let loaded = files.load(&seen)?;
        let identity = Arc::new(Identity(RwLock::new(loaded.identity)));
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(identity.clone());
        // The one protocol served, said in the handshake for clients that ask.
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tls = Tls {
            files: Arc::new(files),
            identity,
            trust: Arc::new(Trust(RwLock::new(loaded.trusted))),
            server: Arc::new(server),
            seen: Arc::new(Mutex::new((seen, true))),
            unreadable: Arc::default(),
            refused: Arc::default(),
            refusal: Arc::default(),
            accepted_until: Arc::default(),
        };
        // Worked out here, so that a scrape only reads it.
        tls.note_accepted_until();
        Ok(tls)
    }

    /// Accepts TLS connections with the node's certificate (the newest one loaded).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    /// A client configuration that trusts the loaded authorities only (the newest ones
    /// loaded, also after it was made).
    pub fn client_config(&self) -> rustls::ClientConfig {
        rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .expect("the aws-lc-rs provider supports the default protocol versions")
            .dangerous()
            // Not a weaker check: every certificate goes to the WebPKI verifier of the
            // authorities loaded last.
            .with_custom_certificate_verifier(self.trust.clone())
            .with_no_client_auth()
    }

    /// Checks that the other members would accept this node's certificate from a node at
    /// `host` (its advertised address's host, if it has one to give): signed by an authority of
    /// its own `--tls-ca` (which the members share), valid now, and naming `host`. A node
    /// whose certificate fails this reaches no member, and no member reaches it, with no other
    /// sign of why.
    pub fn check_identity(&self, host: Option<&str>) -> Result<(), TlsError> {
        self.check_identity_at(host, UnixTime::now())
    }

    fn check_identity_at(&self, host: Option<&str>, now: UnixTime) -> Result<(), TlsError> {
        let identity = self
            .identity
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let roots = self.trust.trusted().roots;
        self.files.check_identity(&identity, &roots, host, now)
    }

    /// Reads the files again and takes them if they changed since they were last taken (or
    /// refused): `Ok(true)` when taken. A set that does not work, or (with `host`) whose
    /// certificate fails [`Tls::check_identity`], is refused, and the node keeps what it had.
    /// A refusal is returned once: the same set, or a file that still cannot be read for the
    /// same reason, is `Ok(false)` until something changes.
    pub fn reload(&self, host: Option<&str>) -> Result<bool, TlsError> {
        let reloaded = self.reload_files(host);
        let unreadable = self
            .unreadable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if let (Err(e), false) = (&reloaded, unreadable) {
            *self.refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        }
        reloaded
    }

    /// [`Tls::reload`], but for noting why a set was refused.
    fn reload_files(&self, host: Option<&str>) -> Result<bool, TlsError> {
        let read = self.files.read();
        {
            let mut unreadable = self.unreadable.lock().unwrap_or_else(|e| e.into_inner());
            let why = read.as_ref().err().map(|e| e.to_string());
            let same = why.is_some() && *unreadable == why;
            *unreadable = why;
            if same {
                return Ok(false);
            }
        }
        let contents = read.inspect_err(|_| self.refused.store(true, Ordering::Relaxed))?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.0 == contents {
            // Back to the bytes last taken (after a file could not be read), or still the ones
            // last refused.
            self.refused.store(!seen.1, Ordering::Relaxed);
            return Ok(false);
        }
        // What was read is what is parsed; not tried again until a file changes, whether
        // taken or refused.
        *seen = (contents, false);
        self.refused.store(true, Ordering::Relaxed);
        let loaded = self.files.load(&seen.0)?;
        self.files.check_identity(
            &loaded.identity,
            &loaded.trusted.roots,
            host,
            UnixTime::now(),
        )?;
        *self.identity.0.write().unwrap_or_else(|e| e.into_inner()) = loaded.identity;
        *self.trust.0.write().unwrap_or_else(|e| e.into_inner()) = loaded.trusted;
        self.note_accepted_until();
        seen.1 = true;
        self.refused.store(false, Ordering::Relaxed);
        Ok(true)
    }

    /// Whether the files, as the last reload found them, are refused or cannot be read: the
    /// node keeps serving with the set it took before, which a restart would not start with.
    pub fn files_refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Why the files, as the last reload found them, are refused or cannot be read (see
    /// [`Tls::files_refused`]); `None` while the ones last read are in use.
    pub fn refusal(&self) -> Option<String> {
        if !self.files_refused() {
            return None;
        }
        let unreadable = self.unreadable.lock().unwrap_or_else(|e| e.into_inner());
        let refused = self.refusal.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            unreadable
                .clone()
                .or_else(|| refused.clone())
                .unwrap_or_else(|| "refused".into()),
        )
    }

    /// The last second, in seconds since the Unix epoch, at which the members accept this
    /// node's certificate as it is now (the earliest end of validity in its chain, the name not
    /// considered); 0 when they did not accept it when it was taken. Worked out when a
    /// certificate is taken ([`Tls::load`], [`Tls::reload`]), so reading it costs nothing.
    pub fn accepted_until(&self) -> u64 {
        self.accepted_until.load(Ordering::Relaxed)
    }

    /// Works out [`Tls::accepted_until`] for the certificate in use: a few dozen checks.
    fn note_accepted_until(&self) {
        let accepted = |secs: u64| {
            let at = UnixTime::since_unix_epoch(Duration::from_secs(secs));
            self.check_identity_at(None, at).is_ok()
        };
        let until = last_accepted(UnixTime::now().as_secs(), accepted);
        self.accepted_until.store(until, Ordering::Relaxed);
    }

    /// Whether this node's certificate, as it is, is still accepted `ahead` from now (at
    /// `host`, if given): `false` when it expires before then.
    pub fn valid_for(&self, host: Option<&str>, ahead: Duration) -> bool {
        let then = UnixTime::since_unix_epoch(Duration::from_secs(
            UnixTime::now().as_secs().saturating_add(ahead.as_secs()),
        ));
        self.check_identity_at(host, then).is_ok()
    }

    /// The whole days, at most [`EXPIRY_WARNING`]'s, before this node's certificate expires
    /// (the first whole day from now at which it is no longer accepted), if it expires within
    /// that; `Some(0)` for one that is no longer accepted.
    pub fn expires_within_days(&self) -> Option<u64> {
        days_left(UnixTime::now().as_secs(), self.accepted_until())
    }

    /// Reads the files every `every`, taking a changed set that works ([`Tls::reload`], checked
    /// for `host` if given), and logs what it did; warns, at start and then at most every hour,
    /// while the certificate expires within [`EXPIRY_WARNING`]. Runs until dropped.
    pub async fn keep_fresh(self, every: Duration, host: Option<String>) {
        let mut warned: Option<std::time::Instant> = None;
        loop {
            let due = warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(3600));
            if due {
                if let Some(days) = self.expires_within_days() {
                    warned = Some(std::time::Instant::now());
                    tracing::warn!(
                        cert = %self.files.cert.display(),
                        "this node's certificate expires within {days} day(s) (or has expired): renew \
                         it (the file is read again every {}s)",
                        every.as_secs()
                    );
                }
            }
            tokio::time::sleep(every).await;
            let tls = self.clone();
            let for_host = host.clone();
            match tokio::task::spawn_blocking(move || tls.reload(for_host.as_deref())).await {
                Ok(Ok(true)) => {
                    tracing::info!(files = ?self.files, "TLS files changed: taken");
                    // A renewed certificate is looked at again at once.
                    warned = None;
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(
                    "the TLS files cannot be used ({e}); keeping the ones loaded before until \
                     they change (the node would not start with them)"
                ),
                Err(e) => tracing::warn!("reading the TLS files again failed: {e}"),
            }
        }
    }
}

/// [`Tls::expires_within_days`] at `now` of a certificate accepted through `until` (0: not
/// accepted when taken).
fn days_left(now: u64, until: u64) -> Option<u64> {
    let days = match until.checked_sub(now) {
        Some(left) if until != 0 => left / 86_400 + 1,
        _ => 0,
    };
    (days <= EXPIRY_WARNING.as_secs() / 86_400).then_some(days)
}

/// The last second from `now` on at which `accepted` holds, given that it holds over one
/// interval of time (a certificate's validity): found by halving, within 10,000 years of the
/// epoch; 0 when it does not hold at `now`.
fn last_accepted(now: u64, accepted: impl Fn(u64) -> bool) -> u64 {
    // 10000-01-01: past any date a certificate can name.
    const END: u64 = 253_402_300_800;
    if !accepted(now) {
        return 0;
    }
    if accepted(END) {
        return END;
    }
    // Accepted at `lo`, not at `hi`.
    let (mut lo, mut hi) = (now, END);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if accepted(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The alert with which a client refused this node's certificate, if that is how a handshake
/// failed: the node's own certificate is then at fault (expired, not signed by the members'
/// authority, not naming the node's host), which only the other end can tell. A signature
/// that does not verify (`DecryptError`) is, in a handshake, almost always the certificate's
/// (signed by another authority of the same name).
pub fn refusal_of_our_certificate(e: &rustls::Error) -> Option<rustls::AlertDescription> {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::AlertReceived(
            alert @ (A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::DecryptError),
        ) => Some(*alert),
        _ => None,
    }
}

/// A client configuration that trusts the authorities in `ca` (PEM) only: what an operator's
/// command or a test uses to talk to a TLS cluster.
pub fn client_config_from(ca: &Path) -> Result<rustls::ClientConfig, TlsError> {
    let pem = std::fs::read(ca).map_err(|e| file_error("the certificate authority", ca, e))?;
    Ok(
        rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .expect("the aws-lc-rs provider supports the default protocol versions")
            .with_root_certificates(roots(&pem, ca)?)
            .with_no_client_auth(),
    )
}

/// The node's certificate and key, as loaded last.
#[derive(Debug)]
struct Identity(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Identity {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The authorities loaded last, and their WebPKI verifier.
#[derive(Debug)]
struct Trust(RwLock<Trusted>);

impl Trust {
    fn trusted(&self) -> Trusted {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn current(&self) -> Arc<WebPkiServerVerifier> {
        self.trusted().verifier
    }
}

impl ServerCertVerifier for Trust {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

fn file_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// The PEM certificates in `pem`, read from `path`.
fn certificates(
    pem: &[u8],
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The authorities in `pem`, read from `ca`.
fn roots(pem: &[u8], ca: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(pem, ca, "the certificate authority")? {
        roots
            .add(cert)
            .map_err(|e| file_error("the certificate authority", ca, e))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::{days_left, last_accepted};

    #[test]
    fn the_days_left_count_the_first_whole_day_it_is_no_longer_accepted() {
        let day = 86_400;
        let now = 1_000 * day;
        assert_eq!(days_left(now, 0), Some(0), "not accepted when taken");
        assert_eq!(days_left(now, now - 1), Some(0), "expired");
        assert_eq!(days_left(now, now), Some(1), "its last second");
        assert_eq!(days_left(now, now + 3 * day - 1), Some(3));
        assert_eq!(days_left(now, now + 3 * day), Some(4));
        assert_eq!(days_left(now, now + 14 * day - 1), Some(14));
        assert_eq!(days_left(now, now + 14 * day), None);
    }

    #[test]
    fn the_last_accepted_second_is_found_exactly() {
        let valid = |from: u64, to: u64| move |t: u64| (from..=to).contains(&t);
        assert_eq!(
            last_accepted(1_000, valid(10, 1_700_000_000)),
            1_700_000_000
        );
        assert_eq!(last_accepted(1_000, valid(10, 1_001)), 1_001);
        assert_eq!(last_accepted(1_000, valid(10, 1_000)), 1_000);
        assert_eq!(last_accepted(1_000, valid(10, 999)), 0);
        assert_eq!(last_accepted(1_000, valid(1_001, 2_000)), 0);
        assert_eq!(last_accepted(1_000, valid(0, u64::MAX)), 253_402_300_800);
    }
}
