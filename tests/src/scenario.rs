//! Small helpers shared by the scenarios: a time limit, and turning an error into a panic while the
//! cluster is still alive (so that its drop prints each node's last output).

use crate::note::note;
use std::future::Future;
use std::time::Duration;

/// Runs `body` for at most `limit`; panics with the error (or the timeout).
///
/// Call it while the [`crate::Cluster`] is still in scope, so its drop sees the panic.
pub async fn within<F>(name: &str, limit: Duration, body: F)
where
    F: Future<Output = anyhow::Result<()>>,
{
    match tokio::time::timeout(limit, body).await {
        Ok(Ok(())) => note(format!("[{name}] passed")),
        Ok(Err(err)) => panic!("[{name}] failed: {err:#}"),
        Err(_) => panic!("[{name}] did not finish within {limit:?}"),
    }
}
