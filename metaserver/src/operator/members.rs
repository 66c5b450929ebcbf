//! The members an operator command may ask (`--server a,b,c`), and which one it asks now: a
//! command moves on to the next when one cannot answer (it is down, restarting, removed, or cut
//! off from its leader), so that one member's trouble does not stop it. Plain bookkeeping,
//! tested without a runtime.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{bail, Result};

/// The members' base URLs (`http://host:port`, or `https://` over TLS), in the order given, and
/// the one asked now.
#[derive(Debug)]
pub(crate) struct Members {
    bases: Vec<String>,
    current: AtomicUsize,
}

impl Members {
    /// Parses `--server`: one member or several, comma-separated, each `host:port` or
    /// `http://host:port`, or with `tls` (`--tls-ca` given) `host:port` or `https://host:port`.
    /// The first is asked first.
    pub(crate) fn parse(server: &str, tls: bool) -> Result<Members> {
        let scheme = if tls { "https://" } else { "http://" };
        let mut bases = Vec::new();
        for one in server.split(',').map(str::trim) {
            let one = one.trim_end_matches('/');
            if one.is_empty() {
                bail!("--server {server:?} names an empty address: give host:port, or several separated by commas");
            }
            // A cluster speaks TLS or plain HTTP: an address of the other kind would only fail
            // on every request.
            if one.starts_with("https://") && !tls {
                bail!("--server {one}: give --tls-ca (METASERVER_TLS_CA), the authority the members' certificates are checked against, to speak TLS");
            }
            if one.starts_with("http://") && tls {
                bail!("--server {one}: with --tls-ca (METASERVER_TLS_CA) the members are asked over TLS; give host:port or https://host:port");
            }
            let base = if one.starts_with(scheme) {
                one.to_owned()
            } else {
                format!("{scheme}{one}")
            };
            let url = reqwest::Url::parse(&base)
                .map_err(|e| anyhow::anyhow!("--server {one:?} is not an address ({e})"))?;
            // A member is a host and a port, nothing more: a path or a query would be put
            // before every route, and a missing port would silently be 80.
            let host_and_port = url.host_str().is_some_and(|h| !h.is_empty())
                && (url.port().is_some() || base.ends_with(":80"))
                && url.path() == "/"
                && url.query().is_none()
                && url.fragment().is_none()
                && url.username().is_empty();
            if !host_and_port {
                bail!("--server {one:?} is not host:port (or {scheme}host:port)");
            }
            if !bases.contains(&base) {
                bases.push(base);
            }
        }
        Ok(Members {
            bases,
            current: AtomicUsize::new(0),
        })
    }

    /// The base URL of the member asked now.
    pub(crate) fn current(&self) -> &str {
        &self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
    }

    /// The members' base URLs, from the one asked now round to the one before it.
    pub(crate) fn in_turn(&self) -> Vec<String> {
        let at = self.current.load(Ordering::Relaxed) % self.bases.len();
        self.bases[at..]
            .iter()
            .chain(&self.bases[..at])
            .cloned()
            .collect()
    }

    /// Makes `base` (one of the members) the one asked now.
    pub(crate) fn settle(&self, base: &str) {
        if let Some(at) = self.bases.iter().position(|b| b == base) {
            self.current.store(at, Ordering::Relaxed);
        }
    }

    /// How many members there are (at least one).
    pub(crate) fn len(&self) -> usize {
        self.bases.len()
    }

    /// Moves on from the member asked now, `asked` (a [`Members::current`] read before the
    /// request), to the next. Returns whether every member has been asked since the command
    /// started or last paused: then the caller pauses before asking again. A move another
    /// request made meanwhile (concurrent requests of one command) counts for this one.
    pub(crate) fn next(&self, asked: &str) -> bool {
        let at = self.current.load(Ordering::Relaxed);
        if self.bases[at % self.bases.len()] == asked {
            // Lost to a concurrent move: that move is this one.
            let _ = self
                .current
                .compare_exchange(at, at + 1, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.current.load(Ordering::Relaxed) % self.bases.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_or_several_members() {
        let one = Members::parse("127.0.0.1:7101", false).unwrap();
        assert_eq!(
            Members::parse("a:80", false).unwrap().current(),
            "http://a:80"
        );
        assert_eq!(one.current(), "http://127.0.0.1:7101");
        assert_eq!(one.len(), 1);
        let three = Members::parse("a:1, http://b:2/,a:1,c:3", false).unwrap();
        assert_eq!(three.bases, ["http://a:1", "http://b:2", "http://c:3"]);
        assert_eq!(three.len(), 3);
        for bad in [
            "",
            "a:1,",
            "https://a:1",
            "a b:1",
            "garbage",
            "127.0.0.1",
            "http://",
            "ftp://x:1",
            "127.0.0.1:7101/v1",
            "a:1?x=1",
        ] {
            assert!(Members::parse(bad, false).is_err(), "{bad:?}");
        }
        // With TLS, bare addresses are https; plain ones are refused.
        let tls = Members::parse("a:1,https://b:2", true).unwrap();
        assert_eq!(tls.bases, ["https://a:1", "https://b:2"]);
        assert!(Members::parse("http://a:1", true).is_err());
    }

    #[test]
    fn moves_on_round_the_members_and_says_when_each_was_asked() {
        let members = Members::parse("a:1,b:2,c:3", false).unwrap();
        assert!(!members.next("http://a:1"));
        assert_eq!(members.current(), "http://b:2");
        // A second failure of a request that asked a (another request moved on already).
        assert!(!members.next("http://a:1"));
        assert_eq!(members.current(), "http://b:2", "one move per failure");
        assert_eq!(
            members.in_turn(),
            ["http://b:2", "http://c:3", "http://a:1"]
        );
        assert!(!members.next("http://b:2"));
        assert!(members.next("http://c:3"), "every member was asked");
        assert_eq!(members.current(), "http://a:1");
        members.settle("http://c:3");
        assert_eq!(members.current(), "http://c:3");
        let one = Members::parse("a:1", false).unwrap();
        assert!(one.next("http://a:1"), "the only member: pause");
        assert_eq!(one.current(), "http://a:1");
    }
}
