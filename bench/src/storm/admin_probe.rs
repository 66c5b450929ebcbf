//! Admin requests during the storm: reads (`GET /v1/shards/{id}` and `GET /v1/cluster`) and a
//! small write (`PUT /v1/kv/bench/probe-{n}`, an operator's key write, which queues for the
//! leader's admission window with the storm's batches), each issued on its own fixed schedule
//! (open loop: a slow request does not delay the next one, so slow ones are not under-counted),
//! rotating over the members, recording the latency of every request.
//!
//! The probes run on a thread of their own, with their own runtime and connections: on the
//! bench's runtime, which also drives every datanode of the storm (thousands of tasks encoding
//! their batches), a read's latency included its wait for that runtime, not only the server's
//! answer (at 2,000 datanodes, p99 ~200-700 ms against ~20 ms measured from outside).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;

use super::api::Api;

/// Reads of one probe that may be outstanding at once; a tick that finds this many is skipped and
/// counted, so a stalled server is not buried under reads.
const MAX_IN_FLIGHT: usize = 256;

/// Latencies of the admin requests of one storm.
#[derive(Debug, Default)]
pub struct AdminLatencies {
    pub shard_ms: Vec<f64>,
    pub cluster_ms: Vec<f64>,
    /// The key writes, with those that failed or were not sent (kept apart from the reads').
    pub write_ms: Vec<f64>,
    pub write_unanswered: u64,
    /// Reads that failed outright or answered with a status other than 200 or 404.
    pub errors: u64,
    /// Reads not sent: ticks skipped because `MAX_IN_FLIGHT` reads of that probe were
    /// outstanding, or because the timer could not run the probe in time.
    pub skipped: u64,
    pub last_error: Option<String>,
}

/// What one probe measured.
#[derive(Debug, Default)]
struct ProbeTally {
    latencies_ms: Vec<f64>,
    errors: u64,
    skipped: u64,
    last_error: Option<String>,
}

/// The running probes; `stop` ends them and returns what they measured.
pub struct AdminProbe {
    stop: watch::Sender<bool>,
    /// The shard, the cluster and the write probe's tallies, once all ended.
    done: oneshot::Receiver<(ProbeTally, ProbeTally, ProbeTally)>,
}

impl AdminProbe {
    /// Starts both probes on a thread of their own, each issuing a read every `interval` with
    /// a client of its own that trusts what `api` trusts.
    /// Shard reads (with `?consistency=` `consistency`) walk over ids below `shard_ids` with a
    /// stride, so they hit shards registered early and late.
    pub fn start(
        api: &Api,
        bases: Vec<String>,
        shard_ids: u64,
        interval: Duration,
        consistency: &str,
    ) -> Result<AdminProbe> {
        let consistency = consistency.to_string();
        let api = api.fresh()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("build the admin probes' runtime")?;
        let (stop, stopped) = watch::channel(false);
        let (finished, done) = oneshot::channel();
        let bases = Arc::new(bases);
        let stride = 7_919u64;
        std::thread::Builder::new()
            .name("admin-probe".into())
            .spawn(move || {
                let shard = probe(
                    api.clone(),
                    bases.clone(),
                    interval,
                    stopped.clone(),
                    false,
                    move |n| {
                        let id = (n * stride) % shard_ids.max(1);
                        format!("/v1/shards/{id}?consistency={consistency}")
                    },
                );
                let cluster = probe(
                    api.clone(),
                    bases.clone(),
                    interval,
                    stopped.clone(),
                    false,
                    |_| "/v1/cluster".to_string(),
                );
                let write = probe(api, bases, interval, stopped, true, |n| {
                    format!("/v1/kv/bench/probe-{}", n % 64)
                });
                let _ =
                    finished.send(runtime.block_on(async { tokio::join!(shard, cluster, write) }));
            })
            .context("start the admin probes' thread")?;
        Ok(AdminProbe { stop, done })
    }

    /// Stops issuing reads, waits for the outstanding ones, and merges the measurements. Fails
    /// if the probes' thread died (no measurement is not a fast one).
    pub async fn stop(self) -> Result<AdminLatencies> {
        let _ = self.stop.send(true);
        let (shard, cluster, write) = self
            .done
            .await
            .context("the admin probes' thread died before it reported")?;
        if let Some(e) = &write.last_error {
            eprintln!("storm: {} admin write(s) failed; last: {e}", write.errors);
        }
        Ok(AdminLatencies {
            shard_ms: shard.latencies_ms,
            cluster_ms: cluster.latencies_ms,
            write_ms: write.latencies_ms,
            write_unanswered: write.errors + write.skipped,
            errors: shard.errors + cluster.errors,
            skipped: shard.skipped + cluster.skipped,
            last_error: cluster.last_error.or(shard.last_error),
        })
    }
}

/// One probe: a read (a key write if `write`) of `path(n)` every `interval` until stopped, then
/// the outstanding requests.
async fn probe(
    api: Api,
    bases: Arc<Vec<String>>,
    interval: Duration,
    mut stopped: watch::Receiver<bool>,
    write: bool,
    path: impl Fn(u64) -> String,
) -> ProbeTally {
    let mut out = ProbeTally::default();
    let mut reads = JoinSet::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut n = 0u64;
    loop {
        // A read is timed from when it was due, not from when it was sent: a probe that runs
        // late must not hide the delay.
        let due = tokio::select! {
            due = ticker.tick() => due.into_std(),
            Some(done) = reads.join_next(), if !reads.is_empty() => {
                record(&mut out, done);
                continue;
            }
            _ = stopped.changed() => break,
        };
        if reads.len() >= MAX_IN_FLIGHT {
            out.skipped += 1;
            continue;
        }
        let url = format!("{}{}", bases[(n as usize) % bases.len()], path(n));
        n += 1;
        let api = api.clone();
        reads.spawn(async move {
            let status = match write {
                true => api.put_status(&url, "probe").await,
                false => api.get_status(&url).await,
            };
            (url, status, due.elapsed())
        });
    }
    // Ticks the timer skipped (this task was not run in time) count as reads not sent, as
    // those skipped for too many outstanding ones do: a stall must not hide as fewer samples.
    // The tick due last may not have been taken yet when the probe stopped: not counted.
    let due = (started.elapsed().as_nanos() / interval.as_nanos().max(1)) as u64;
    out.skipped += due.saturating_sub(n + out.skipped);
    while let Some(done) = reads.join_next().await {
        record(&mut out, done);
    }
    out
}

/// Adds one finished read to the tally.
fn record(
    out: &mut ProbeTally,
    done: Result<(String, Result<u16, super::api::CallError>, Duration), tokio::task::JoinError>,
) {
    match done {
        // A shard not registered yet is an answer; a cluster view is always there.
        Ok((url, Ok(status), took))
            if status == 200 || (status == 404 && url.contains("/v1/shards/")) =>
        {
            out.latencies_ms.push(took.as_secs_f64() * 1e3)
        }
        Ok((url, Ok(status), _)) => {
            out.errors += 1;
            out.last_error = Some(format!("{url}: status {status}"));
        }
        Ok((_, Err(e), _)) => {
            out.errors += 1;
            out.last_error = Some(e.to_string());
        }
        Err(e) => {
            out.errors += 1;
            out.last_error = Some(format!("a read task failed: {e}"));
        }
    }
}
