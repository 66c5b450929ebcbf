//! The files a node's TLS is made of (`--tls-cert`, `--tls-key`, `--tls-ca`): given all
//! together or not at all, and read before the node opens its data dir.

use std::path::PathBuf;

use anyhow::{bail, Result};

/// The files a node's TLS is made of (`--tls-cert`, `--tls-key`, `--tls-ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
    /// The authorities the members' certificates are checked against, PEM.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// All three files or none: a node given some would serve plain HTTP, or reach no member.
    pub(crate) fn resolve(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            (cert, key, ca) => {
                let missing: Vec<&str> = [
                    ("--tls-cert", cert.is_none()),
                    ("--tls-key", key.is_none()),
                    ("--tls-ca", ca.is_none()),
                ]
                .into_iter()
                .filter_map(|(flag, missing)| missing.then_some(flag))
                .collect();
                bail!(
                    "TLS needs --tls-cert, --tls-key and --tls-ca together; {} missing",
                    missing.join(" and ")
                )
            }
        }
    }

    /// Reads the files; fails naming the one that cannot be used.
    pub fn load(&self) -> Result<meta_http::Tls> {
        Ok(meta_http::Tls::load(&self.cert, &self.key, &self.ca)?)
    }

    /// The permission bits of the private key's file when every user of the machine may read
    /// it (worth a warning: whoever reads it can answer as this node), else `None` (also when
    /// they cannot be read: loading says why).
    pub fn key_readable_by_all(&self) -> Option<u32> {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&self.key).ok()?.permissions().mode() & 0o777;
        (mode & 0o004 != 0).then_some(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_every_user_may_read_is_told_apart() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, "k").unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: key.clone(),
            ca: dir.path().join("ca.pem"),
        };
        let chmod = |mode| std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode));
        chmod(0o644).unwrap();
        assert_eq!(files.key_readable_by_all(), Some(0o644));
        for private in [0o600, 0o640, 0o400] {
            chmod(private).unwrap();
            assert_eq!(files.key_readable_by_all(), None, "{private:o}");
        }
        std::fs::remove_file(&key).unwrap();
        assert_eq!(
            files.key_readable_by_all(),
            None,
            "a missing file is loading's to name"
        );
    }

    #[test]
    fn the_three_files_come_together_or_not_at_all() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(TlsFiles::resolve(None, None, None).unwrap(), None);
        assert_eq!(
            TlsFiles::resolve(p("c"), p("k"), p("a")).unwrap(),
            Some(TlsFiles {
                cert: "c".into(),
                key: "k".into(),
                ca: "a".into()
            })
        );
        let err = TlsFiles::resolve(p("c"), None, p("a")).unwrap_err();
        assert!(err.to_string().ends_with("--tls-key missing"), "{err}");
        let err = TlsFiles::resolve(None, None, p("a")).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("--tls-cert and --tls-key missing"),
            "{err}"
        );
    }
}
