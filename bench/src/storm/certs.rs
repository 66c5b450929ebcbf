//! The certificates of the `tls` arm: a certificate authority made for the run, and one
//! certificate it signed for 127.0.0.1 that every member serves with, as PEM files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// PEM files of a run's TLS: the authority, the members' certificate and its key.
#[derive(Debug, Clone)]
pub struct BenchCerts {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl BenchCerts {
    /// Makes a new authority and a certificate for 127.0.0.1, written into `dir`.
    pub fn make(dir: &Path) -> Result<BenchCerts> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let ca_key = rcgen::KeyPair::generate().context("a CA key")?;
        let mut ca_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params
            .self_signed(&ca_key)
            .context("the CA certificate")?;
        let key = rcgen::KeyPair::generate().context("a member key")?;
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .context("member parameters")?
            .signed_by(&key, &ca, &ca_key)
            .context("the member certificate")?;
        let certs = BenchCerts {
            ca: dir.join("ca.pem"),
            cert: dir.join("member.pem"),
            key: dir.join("member.key"),
        };
        for (path, pem) in [
            (&certs.ca, ca.pem()),
            (&certs.cert, cert.pem()),
            (&certs.key, key.serialize_pem()),
        ] {
            std::fs::write(path, pem).with_context(|| format!("write {}", path.display()))?;
        }
        Ok(certs)
    }

    /// The `serve` flags of a member with these certificates.
    pub fn server_flags(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--tls-cert".into(),
            self.cert.clone().into(),
            "--tls-key".into(),
            self.key.clone().into(),
            "--tls-ca".into(),
            self.ca.clone().into(),
        ]
    }
}
