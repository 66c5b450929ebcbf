//! The registration storm: concurrent datanodes register shards in batches (and a key-value writer
//! writes fresh keys) against random live nodes, retrying whatever got no answer, and record every
//! outcome in the [`Model`].

use crate::note::note;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::client::{Api, ApiError, Consistency, ShardReport};
use crate::cluster::Endpoints;
use crate::model::Model;
use crate::poll::poll_until;
use crate::seed::derived_rng;

/// How long a stopped storm keeps retrying the batch it has in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the storm does.
#[derive(Clone, Debug)]
pub struct StormConfig {
    /// Datanode ids; each registers itself, then its own shards (ids `datanode * 10^9 + n`).
    pub datanodes: Vec<u64>,
    /// Shards per batch.
    pub batch: usize,
    /// Each datanode stops after this many batches (`None`: until stopped).
    pub batches_per_datanode: Option<u64>,
    /// Number of key-value writers.
    pub kv_writers: usize,
    /// Prefix of the keys written.
    pub kv_prefix: String,
    /// Pause after each acknowledged batch or key (keeps a long storm's volume bounded).
    pub pause: Duration,
}

impl Default for StormConfig {
    fn default() -> Self {
        StormConfig {
            datanodes: (1..=6).collect(),
            batch: 200,
            batches_per_datanode: None,
            kv_writers: 1,
            kv_prefix: String::from("storm/"),
            pause: Duration::ZERO,
        }
    }
}

impl StormConfig {
    /// A slower storm for scenarios that keep it running through long phases: three datanodes,
    /// batches of 100, a pause of 100 ms after each acknowledged write.
    pub fn background() -> StormConfig {
        StormConfig {
            datanodes: (1..=3).collect(),
            batch: 100,
            pause: Duration::from_millis(100),
            ..StormConfig::default()
        }
    }

    /// A bulk load that ends by itself: each of `datanodes` registers `batches` batches of `batch`
    /// shards; no key-value writers.
    pub fn bulk(datanodes: Vec<u64>, batch: usize, batches: u64) -> StormConfig {
        StormConfig {
            datanodes,
            batch,
            batches_per_datanode: Some(batches),
            kv_writers: 0,
            kv_prefix: String::from("bulk/"),
            ..StormConfig::default()
        }
    }
}

/// A running storm.
pub struct Storm {
    stopping: Arc<AtomicBool>,
    stop_at: Arc<Mutex<Option<Instant>>>,
    tasks: Vec<JoinHandle<()>>,
    model: Arc<Mutex<Model>>,
    datanodes: usize,
    datanodes_done: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Ctx {
    endpoints: Endpoints,
    http: reqwest::Client,
    model: Arc<Mutex<Model>>,
    stopping: Arc<AtomicBool>,
    stop_at: Arc<Mutex<Option<Instant>>>,
}

impl Ctx {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Whether a stopped storm should give up retrying.
    fn drained(&self) -> bool {
        self.stop_at
            .lock()
            .unwrap()
            .is_some_and(|at| at.elapsed() > DRAIN_TIMEOUT)
    }

    fn pick(&self, rng: &mut fastrand::Rng) -> Option<Api> {
        let live = self.endpoints.live();
        if live.is_empty() {
            return None;
        }
        let (_, addr) = live[rng.usize(..live.len())];
        Some(Api::with_client(self.http.clone(), addr))
    }

    async fn backoff(&self, rng: &mut fastrand::Rng) {
        tokio::time::sleep(Duration::from_millis(rng.u64(20..80))).await;
    }

    fn anomaly(&self, text: String) {
        note(format!("storm anomaly: {text}"));
        self.model.lock().unwrap().anomalies.push(text);
    }
}

impl Storm {
    /// Starts the storm on the current runtime.
    pub fn start(
        endpoints: Endpoints,
        http: reqwest::Client,
        model: Arc<Mutex<Model>>,
        config: StormConfig,
        seed: u64,
    ) -> Storm {
        let stopping = Arc::new(AtomicBool::new(false));
        let ctx = Ctx {
            endpoints,
            http,
            model: model.clone(),
            stopping: stopping.clone(),
            stop_at: Arc::default(),
        };
        let mut tasks = Vec::new();
        let datanodes_done = Arc::new(AtomicUsize::new(0));
        for datanode in config.datanodes.clone() {
            let ctx = ctx.clone();
            let config = config.clone();
            let done = datanodes_done.clone();
            tasks.push(tokio::spawn(async move {
                datanode_task(ctx, datanode, config, derived_rng(seed, datanode)).await;
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        for writer in 0..config.kv_writers {
            let ctx = ctx.clone();
            let prefix = format!("{}{writer}/", config.kv_prefix);
            let pause = config.pause;
            tasks.push(tokio::spawn(async move {
                kv_task(
                    ctx,
                    prefix,
                    pause,
                    derived_rng(seed, 1_000_000 + writer as u64),
                )
                .await;
            }));
        }
        Storm {
            stopping,
            stop_at: ctx.stop_at,
            tasks,
            model,
            datanodes: config.datanodes.len(),
            datanodes_done,
        }
    }

    /// The shared model.
    pub fn model(&self) -> Arc<Mutex<Model>> {
        self.model.clone()
    }

    /// Acknowledged replicas so far.
    pub fn acked_replicas(&self) -> u64 {
        self.model.lock().unwrap().acked().1
    }

    /// Waits until at least `more` replicas beyond the current count are acknowledged.
    pub async fn wait_progress(&self, more: u64, timeout: Duration) -> anyhow::Result<()> {
        let target = self.acked_replicas() + more;
        poll_until(
            &format!("{target} acknowledged replicas"),
            timeout,
            || async {
                let now = self.acked_replicas();
                if now >= target {
                    Ok(Some(()))
                } else {
                    anyhow::bail!("{now} acknowledged")
                }
            },
        )
        .await
    }

    /// Waits until every datanode has sent all its batches (with `batches_per_datanode`).
    pub async fn wait_finished(&self, timeout: Duration) -> anyhow::Result<()> {
        poll_until(
            "every datanode to send all its batches",
            timeout,
            || async {
                let done = self.datanodes_done.load(Ordering::SeqCst);
                if done == self.datanodes {
                    Ok(Some(()))
                } else {
                    anyhow::bail!("{done} of {} datanodes done", self.datanodes)
                }
            },
        )
        .await
    }

    /// Runs a storm that ends by itself (see [`StormConfig::bulk`]) to its end, within `timeout`,
    /// recording every acknowledged write in `model`.
    pub async fn run_to_end(
        endpoints: Endpoints,
        http: reqwest::Client,
        model: Arc<Mutex<Model>>,
        config: StormConfig,
        seed: u64,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let storm = Storm::start(endpoints, http, model, config, seed);
        storm.wait_finished(timeout).await?;
        storm.stop().await?;
        Ok(())
    }

    /// Stops issuing new writes, lets the writes in flight finish (retrying up to [`DRAIN_TIMEOUT`]),
    /// and returns the model.
    pub async fn stop(self) -> anyhow::Result<Arc<Mutex<Model>>> {
        self.stop_at
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        self.stopping.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await?;
        }
        Ok(self.model)
    }
}

async fn datanode_task(ctx: Ctx, datanode: u64, config: StormConfig, mut rng: fastrand::Rng) {
    let addr = format!("127.0.0.1:{}", 20_000 + datanode % 40_000);
    let Some(mut epoch) = register_datanode(&ctx, datanode, &addr, &mut rng).await else {
        return;
    };
    let mut next = datanode * 1_000_000_000;
    let mut sent = 0u64;
    while !ctx.stopping() && config.batches_per_datanode.is_none_or(|max| sent < max) {
        let shards: Vec<ShardReport> = (0..config.batch)
            .map(|i| ShardReport {
                id: next + i as u64,
                generation: rng.u64(1..4),
                size: rng.u64(1..1 << 30),
            })
            .collect();
        next += config.batch as u64;
        sent += 1;
        let id = ctx.model.lock().unwrap().batch_sent(datanode, &shards);
        let mut attempts = 0u32;
        loop {
            if ctx.drained() {
                break;
            }
            let Some(api) = ctx.pick(&mut rng) else {
                ctx.backoff(&mut rng).await;
                continue;
            };
            attempts += 1;
            match api.register_shards(datanode, epoch, &shards).await {
                Ok(answer) => {
                    let total = answer.accepted + answer.unchanged;
                    if total != shards.len() as u64
                        || !answer.stale.is_empty()
                        || (attempts == 1 && answer.unchanged != 0)
                    {
                        ctx.anomaly(format!(
                            "datanode {datanode}: batch of {} fresh shards answered {answer:?} (attempt {attempts})",
                            shards.len()
                        ));
                    }
                    ctx.model.lock().unwrap().batch_acked(id);
                    tokio::time::sleep(config.pause).await;
                    break;
                }
                Err(err) if err.code() == Some("fenced") => {
                    // Only an unanswered re-registration of this datanode could have changed the epoch.
                    ctx.anomaly(format!(
                        "datanode {datanode}: batch at epoch {epoch} fenced: {err}"
                    ));
                    match register_datanode(&ctx, datanode, &addr, &mut rng).await {
                        Some(new) => epoch = new,
                        None => break,
                    }
                }
                Err(err) if err.is_definite_rejection() => {
                    ctx.anomaly(format!("datanode {datanode}: batch refused: {err}"));
                    if attempts == 1 {
                        ctx.model.lock().unwrap().batch_rejected(id);
                    }
                    break;
                }
                Err(_) => ctx.backoff(&mut rng).await,
            }
        }
    }
}

async fn register_datanode(
    ctx: &Ctx,
    datanode: u64,
    addr: &str,
    rng: &mut fastrand::Rng,
) -> Option<u64> {
    loop {
        if ctx.drained()
            || (ctx.stopping() && ctx.model.lock().unwrap().datanode_epoch(datanode).is_none())
        {
            return None;
        }
        let Some(api) = ctx.pick(rng) else {
            ctx.backoff(rng).await;
            continue;
        };
        match api.register_datanode(datanode, addr).await {
            Ok(epoch) => {
                ctx.model.lock().unwrap().datanode_acked(datanode, epoch);
                return Some(epoch);
            }
            Err(err) if err.is_definite_rejection() => {
                ctx.anomaly(format!("datanode {datanode}: registration refused: {err}"));
                return None;
            }
            Err(_) => {
                ctx.model.lock().unwrap().datanode_uncertain(datanode);
                ctx.backoff(rng).await;
            }
        }
    }
}

async fn kv_task(ctx: Ctx, prefix: String, pause: Duration, mut rng: fastrand::Rng) {
    let mut seq = 0u64;
    while !ctx.stopping() {
        seq += 1;
        let key = format!("{prefix}{seq:08}");
        let value = format!("value-{seq}-{}", rng.u64(..)).into_bytes();
        ctx.model.lock().unwrap().kv_sent(&key, &value);
        let mut attempts = 0u32;
        loop {
            if ctx.drained() {
                break;
            }
            let Some(api) = ctx.pick(&mut rng) else {
                ctx.backoff(&mut rng).await;
                continue;
            };
            attempts += 1;
            match api.kv_put(&key, &value, Some(0)).await {
                Ok(revision) => {
                    ctx.model.lock().unwrap().kv_acked(&key, &value, revision);
                    tokio::time::sleep(pause).await;
                    break;
                }
                Err(err) if err.code() == Some("revision_mismatch") && attempts > 1 => {
                    // An earlier attempt landed: it must hold exactly our value.
                    if let Some(found) = read_back(&ctx, &key, &mut rng).await {
                        match found {
                            Some((v, revision)) if v == value => {
                                ctx.model.lock().unwrap().kv_acked(&key, &value, revision);
                            }
                            other => ctx
                                .anomaly(format!("key {key}: expected our value, found {other:?}")),
                        }
                    }
                    break;
                }
                Err(err) if err.is_definite_rejection() => {
                    ctx.anomaly(format!("key {key}: put refused: {err}"));
                    if attempts == 1 {
                        ctx.model.lock().unwrap().kv_rejected(&key);
                    }
                    break;
                }
                Err(_) => ctx.backoff(&mut rng).await,
            }
        }
    }
}

async fn read_back(
    ctx: &Ctx,
    key: &str,
    rng: &mut fastrand::Rng,
) -> Option<Option<(Vec<u8>, u64)>> {
    loop {
        if ctx.drained() {
            return None;
        }
        if let Some(api) = ctx.pick(rng) {
            match api.kv_get(key, Consistency::Linearizable).await {
                Ok(found) => return Some(found),
                Err(ApiError::Status { status, .. }) if (400..500).contains(&status) => {
                    return Some(None)
                }
                Err(_) => {}
            }
        }
        ctx.backoff(rng).await;
    }
}
