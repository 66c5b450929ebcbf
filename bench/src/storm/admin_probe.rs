//! Admin reads during the storm: `GET /v1/shards/{id}` and `GET /v1/cluster`, each on its own timer,
//! rotating over the members, recording the latency of every read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::api::Api;

/// Latencies of the admin reads of one storm.
#[derive(Debug, Default)]
pub struct AdminLatencies {
    pub shard_ms: Vec<f64>,
    pub cluster_ms: Vec<f64>,
    /// Reads that failed outright or answered with a status other than 200 or 404.
    pub errors: u64,
    pub last_error: Option<String>,
}

/// The running probes; `stop` ends them and returns what they measured.
pub struct AdminProbe {
    stop: watch::Sender<bool>,
    shard: JoinHandle<AdminLatencies>,
    cluster: JoinHandle<AdminLatencies>,
}

impl AdminProbe {
    /// Starts both probes, each reading every `interval` (a late read delays the next rather than
    /// bunching up). Shard reads walk over ids below `shard_ids` with a stride, so they hit shards
    /// registered early and late.
    pub fn start(api: &Api, bases: Vec<String>, shard_ids: u64, interval: Duration) -> AdminProbe {
        let (stop, stopped) = watch::channel(false);
        let bases = Arc::new(bases);
        let stride = 7_919u64;
        let shard = tokio::spawn(probe(
            api.clone(),
            bases.clone(),
            interval,
            stopped.clone(),
            move |n| format!("/v1/shards/{}", (n * stride) % shard_ids.max(1)),
        ));
        let cluster = tokio::spawn(probe(api.clone(), bases, interval, stopped, |_| {
            "/v1/cluster".to_string()
        }));
        AdminProbe {
            stop,
            shard,
            cluster,
        }
    }

    /// Stops both probes and merges their measurements.
    pub async fn stop(self) -> AdminLatencies {
        let _ = self.stop.send(true);
        let shard = self.shard.await.unwrap_or_default();
        let cluster = self.cluster.await.unwrap_or_default();
        AdminLatencies {
            shard_ms: shard.shard_ms,
            cluster_ms: cluster.shard_ms,
            errors: shard.errors + cluster.errors,
            last_error: cluster.last_error.or(shard.last_error),
        }
    }
}

/// One probe loop; its latencies are returned in `shard_ms` whatever it reads.
async fn probe(
    api: Api,
    bases: Arc<Vec<String>>,
    interval: Duration,
    mut stopped: watch::Receiver<bool>,
    path: impl Fn(u64) -> String,
) -> AdminLatencies {
    let mut out = AdminLatencies::default();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopped.changed() => return out,
        }
        let url = format!("{}{}", bases[(n as usize) % bases.len()], path(n));
        n += 1;
        let sent = Instant::now();
        match api.get_status(&url).await {
            Ok(200 | 404) => out.shard_ms.push(sent.elapsed().as_secs_f64() * 1e3),
            Ok(status) => {
                out.errors += 1;
                out.last_error = Some(format!("GET {url}: status {status}"));
            }
            Err(e) => {
                out.errors += 1;
                out.last_error = Some(e.to_string());
            }
        }
    }
}
