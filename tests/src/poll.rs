//! Waiting on a condition with a deadline: the only way the tests wait for the cluster.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is re-checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Calls `check` until it returns `Ok(Some(value))` or `timeout` has passed.
///
/// `Ok(None)` and `Err(_)` both mean "not yet"; the last of them is reported when the deadline passes,
/// so a failure says what the condition looked like at the end.
pub async fn poll_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => String::from("condition not met"),
            Err(err) => format!("{err:#}"),
        };
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
