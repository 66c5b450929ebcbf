//! The process's limit of open files, and how much of it the server spends on connections.
//!
//! Many systems start services with a soft limit of 1,024 open files and a much higher hard
//! limit. A registration storm of thousands of datanodes needs a descriptor per connection, so
//! at startup the soft limit is raised to the hard one (as Go's runtime and most servers do),
//! and the HTTP listener may keep all but [`RESERVED_FILES`] of them as connections: the rest
//! stay free for the log's segments, the registry's files, snapshots and peer connections.

use std::io;

/// Descriptors kept out of the connection budget for the node's own files, its connections to
/// peers, and the listener's reserve of connections for traffic between members
/// ([`meta_http::connection_limit::MEMBER_CONNECTIONS`]).
pub const RESERVED_FILES: u64 = 256;
/// A limit below this is warned about: [`RESERVED_FILES`] and [`MIN_CONNECTIONS`] need most
/// of it.
const LOW_LIMIT: u64 = 400;
/// The fewest connections served, however low the limit.
const MIN_CONNECTIONS: u64 = 64;
/// A soft limit is not raised past this, even when the hard limit is unlimited.
const MAX_SOFT_LIMIT: u64 = 1 << 20;

/// The soft limit of open files before and after [`raise`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    pub before: u64,
    pub now: u64,
}

impl OpenFiles {
    /// Connections the listener may hold open: the limit less [`RESERVED_FILES`], but at least
    /// [`MIN_CONNECTIONS`].
    pub fn connection_budget(&self) -> usize {
        let budget = self.now.saturating_sub(RESERVED_FILES).max(MIN_CONNECTIONS);
        usize::try_from(budget).unwrap_or(usize::MAX)
    }
}

/// The soft and hard limit of open files now.
fn limits() -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit)
}

/// The soft limit of open files now, unchanged.
pub fn current() -> io::Result<OpenFiles> {
    let now = limits()?.rlim_cur;
    Ok(OpenFiles { before: now, now })
}

/// Raises the soft limit of open files to the hard limit (at most [`MAX_SOFT_LIMIT`]). Never
/// lowers it. On an error the limit is unchanged.
pub fn raise() -> io::Result<OpenFiles> {
    let mut limit = limits()?;
    let before = limit.rlim_cur;
    let wanted = limit.rlim_max.min(MAX_SOFT_LIMIT);
    if wanted <= before {
        return Ok(OpenFiles {
            before,
            now: before,
        });
    }
    limit.rlim_cur = wanted;
    // SAFETY: setrlimit reads the struct it is given; a soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OpenFiles {
        before,
        now: wanted,
    })
}

/// Raises the limit ([`raise`]), logs the outcome, and returns how many connections the
/// listener may hold open.
pub fn connection_slots() -> usize {
    match raise() {
        Ok(files) => {
            if files.now < LOW_LIMIT {
                tracing::warn!(
                    open_files_limit = files.now,
                    max_connections = files.connection_budget(),
                    "the open-files limit is low: the node may run short of descriptors for \
                     its files, its peers and {} connections; raise the hard limit (systemd \
                     LimitNOFILE=, or ulimit -Hn) to at least {LOW_LIMIT}",
                    files.connection_budget()
                );
            } else {
                tracing::info!(
                    open_files_limit = files.now,
                    raised_from = files.before,
                    max_connections = files.connection_budget(),
                    "connections are limited by the open-files limit"
                );
            }
            files.connection_budget()
        }
        Err(e) => {
            let files = current().unwrap_or(OpenFiles {
                before: 1024,
                now: 1024,
            });
            tracing::warn!(
                open_files_limit = files.now,
                max_connections = files.connection_budget(),
                "could not raise the open-files limit: {e}"
            );
            files.connection_budget()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_the_reserve_free_but_never_drops_below_the_minimum() {
        let budget = |now| OpenFiles { before: now, now }.connection_budget();
        assert_eq!(budget(1024), 768);
        assert_eq!(budget(65_536), 65_280);
        assert_eq!(budget(100), 64);
        assert_eq!(budget(0), 64);
    }

    #[test]
    fn raising_reaches_the_hard_limit_and_never_lowers_the_soft_one() {
        let raised = raise().unwrap();
        assert!(raised.now >= raised.before);
        let limit = limits().unwrap();
        assert_eq!(limit.rlim_cur, raised.now);
        assert_eq!(
            raised.now,
            limit.rlim_max.min(MAX_SOFT_LIMIT).max(raised.before)
        );
        // Raising again changes nothing.
        assert_eq!(raise().unwrap().now, raised.now);
        assert_eq!(current().unwrap().now, raised.now);
    }
}
