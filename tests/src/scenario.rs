//! Small helpers shared by the scenarios: starting a scenario's cluster with its seed, a time limit,
//! and turning an error into a panic while the cluster is still alive (so that its drop prints each
//! node's last output).

use crate::cluster::{Cluster, ClusterConfig};
use crate::note::{note, print_kept};
use crate::seed::test_seed;
use std::future::Future;
use std::time::{Duration, Instant};

/// A scenario that passes after this long still prints its progress (see [`within`]).
const SLOW: Duration = Duration::from_secs(30);

/// Runs `body` for at most `limit`; panics with the error (or the timeout). A pass that took
/// longer than `SLOW` prints the progress lines, so a slow run can be read afterwards.
///
/// Call it while the [`crate::Cluster`] is still in scope, so its drop sees the panic.
pub async fn within<F>(name: &str, limit: Duration, body: F)
where
    F: Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    match tokio::time::timeout(limit, body).await {
        Ok(Ok(())) => {
            note(format!("[{name}] passed"));
            if started.elapsed() > SLOW {
                print_kept(&format!("[{name}] passed but took {:?}", started.elapsed()));
            }
        }
        Ok(Err(err)) => panic!("[{name}] failed: {err:#}"),
        Err(_) => panic!("[{name}] did not finish within {limit:?}"),
    }
}

/// Draws the seed for `name` (printed; replayable), starts a cluster labelled `label` with
/// `config`, and runs `body` on them for at most `limit` (see [`within`]).
pub async fn run_scenario(
    name: &str,
    label: &str,
    config: ClusterConfig,
    limit: Duration,
    body: impl AsyncFnOnce(&mut Cluster, u64) -> anyhow::Result<()>,
) {
    let seed = test_seed(name);
    let mut cluster = Cluster::start(label, config)
        .await
        .expect("start the cluster");
    within(name, limit, body(&mut cluster, seed)).await;
}
